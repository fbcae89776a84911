"""Exec's record frames, sent pre-encoded (``service.sessions.add_to_server``, what the test host
and ``agentsessions serve`` use), are the stored records verbatim; the generated registration
still serves every frame as a message."""

from __future__ import annotations

from grpc import aio

from agentsessions.host.controller.state import SessionView
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.service.convert import SessionWire, session_proto
from agentsessions.host.service.sessions import SessionsServicer
from agentsessions.v1 import common_pb2, session_pb2, session_pb2_grpc
from tests.support.host import running_host, text_input


async def test_pre_encoded_records_are_the_stored_records(store: JournalStore) -> None:
    async with running_host(store) as host:
        created = await host.sessions.CreateSession(
            session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="echo"))
        )
        uid = created.metadata.uid
        for text in ("one", "two" * 1000):
            updates = await host.exec(session_pb2.ExecRequest(session=uid, inputs=[text_input(text)]))
            streamed = [u.record for u in updates if u.WhichOneof("update") == "record"]
            stored = await store.read(uid, streamed[0].seq, streamed[-1].seq)
            assert [r.SerializeToString() for r in streamed] == [r.SerializeToString() for r in stored]
            assert len(streamed) == 5


async def test_the_generated_registration_still_serves_messages(store: JournalStore) -> None:
    async with running_host(store) as host:
        server = aio.server()
        servicer = SessionsServicer(host.controller)
        session_pb2_grpc.add_SessionsServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = session_pb2_grpc.SessionsStub(channel)
                created = await stub.CreateSession(
                    session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="echo"))
                )
                request = session_pb2.ExecRequest(session=created.metadata.uid, inputs=[text_input("hi")])
                updates = [u async for u in stub.Exec(request)]
        finally:
            await server.stop(None)
    assert servicer.pre_encoded is False
    # Session, EXECUTION_START, INPUT, MODEL_CALL, the done delta, OUTPUT, END.
    assert [u.WhichOneof("update") for u in updates] == [
        "session",
        *["record"] * 3,
        "delta",
        "record",
        "record",
    ]


async def test_a_pre_encoded_page_of_sessions_is_the_page_as_a_message(store: JournalStore) -> None:
    """ListSessions encodes its page itself (to check its size) and sends those bytes as they are."""
    async with running_host(store) as host:
        for i in range(5):
            await host.sessions.CreateSession(
                session_pb2.CreateSessionRequest(
                    session=session_pb2.Session(
                        harness="echo",
                        labels={"team": f"t{i}"},
                        annotations={"note": "x" * i},
                        metadata=common_pb2.ResourceMetadata(project="frames", name=f"s{i}"),
                    )
                )
            )
        server = aio.server()
        session_pb2_grpc.add_SessionsServicer_to_server(SessionsServicer(host.controller), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = session_pb2_grpc.SessionsStub(channel)
                token, sizes = "", []
                for _ in range(2):
                    request = session_pb2.ListSessionsRequest(project="frames", page_size=3, page_token=token)
                    pre_encoded = await host.sessions.ListSessions(request)
                    as_message = await stub.ListSessions(request)
                    assert pre_encoded == as_message
                    sizes.append(len(pre_encoded.sessions))
                    token = pre_encoded.next_page_token
                assert sizes == [3, 2]
                assert token == ""
        finally:
            await server.stop(None)


async def test_a_page_encoded_by_hand_is_the_page_built_as_a_message(store: JournalStore) -> None:
    """A page under the limit goes out whole, with the token of the page after it: what protobuf
    itself would write for it (sessions in order, with labels and annotations, not yet run),
    then the token), the same when its sessions' encodings are kept and when they are made anew.
    (Compared decoded: a map's entries may go out in any order.)"""
    async with running_host(store) as host:
        for i in range(3):
            await host.sessions.CreateSession(
                session_pb2.CreateSessionRequest(
                    session=session_pb2.Session(
                        harness="echo",
                        labels={"team": f"t{i}", "z": "\n"},
                        annotations={"note": "x" * 100 * i},
                        metadata=common_pb2.ResourceMetadata(name=f"s{i}"),
                    )
                )
            )
        views, token = await host.controller.list_sessions("", 2, "")
        assert token
        page = session_pb2.ListSessionsResponse(next_page_token=token)
        for view in views:
            page.sessions.append(session_proto(view))
        servicer = SessionsServicer(host.controller)
        encoded = servicer.encode_page(views, token)
        assert session_pb2.ListSessionsResponse.FromString(encoded) == page
        assert servicer.wires.encoded == 2
        # Unchanged, the same rows come back from the store (every store keeps them), and their
        # bytes are kept.
        again, _ = await host.controller.list_sessions("", 2, "")
        assert servicer.encode_page(again, token) == encoded
        assert servicer.wires.encoded == 2
        last, none = await host.controller.list_sessions("", 2, token)
        assert none == "" and len(last) == 1
        whole = session_pb2.ListSessionsResponse(sessions=[session_proto(last[0])])
        assert session_pb2.ListSessionsResponse.FromString(servicer.encode_page(last, "")) == whole


async def test_a_listed_sessions_encoding_is_kept_for_its_row_and_state_and_bounded(
    store: JournalStore,
) -> None:
    async with running_host(store) as host:
        for _ in range(3):
            await host.sessions.CreateSession(session_pb2.CreateSessionRequest())
        views, _ = await host.controller.list_sessions("", 10, "")
        framed = SessionWire(2)
        page = b"".join(framed.framed(views))
        expected = session_pb2.ListSessionsResponse(sessions=[session_proto(v) for v in views])
        assert session_pb2.ListSessionsResponse.FromString(page) == expected
        assert framed.encoded == 3 and len(framed._kept) <= 2
        # The same row in another state (a turn now running here) is encoded anew.
        running = SessionView(views[-1].row, session_pb2.EXEC_RUNNING)
        (one,) = framed.framed([running])
        decoded = session_pb2.ListSessionsResponse.FromString(one).sessions[0]
        assert decoded.exec_state == session_pb2.EXEC_RUNNING and framed.encoded == 4
        assert framed.framed([running]) == [one] and framed.encoded == 4
        assert len(framed._kept) == 1  # the running one took its session's place
        none = SessionWire(0)
        assert b"".join(none.framed(views)) == b"".join(none.framed(views))
        assert none.encoded == 6 and not none._kept
