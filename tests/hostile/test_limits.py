"""The host's limits (issue #15 item 3): each refused before anything is written, with
INVALID_ARGUMENT (a request over a size limit) or RESOURCE_EXHAUSTED (a capacity limit), the
message naming the limit's flag."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator

import grpc
import pytest

from agentsessions.host.journal.memory import MemoryStore
from agentsessions.host.limits import MAX_READABLE_BYTES, Limits
from agentsessions.host.models.provider import DeltaCallback
from agentsessions.v1 import common_pb2, harness_pb2, session_pb2
from tests.support.harnesses import GateHarness
from tests.support.host import HostUnderTest, running_host, text_input
from tests.support.host_process import BIN, repo_env

SMALL = Limits(
    max_identity_bytes=64,
    max_input_bytes=4096,
    max_record_bytes=8192,
    max_executions=2,
    max_project_executions=1,
)


@pytest.fixture
def gate() -> GateHarness:
    return GateHarness()


@pytest.fixture
async def host(gate: GateHarness) -> AsyncIterator[HostUnderTest]:
    async with running_host(MemoryStore(), local={"gate": gate}, limits=SMALL) as h:
        yield h


async def _refusal(call: object) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                raise AssertionError("a frame before the refusal")
        else:
            await call  # type: ignore[misc]
    return caught.value.code(), caught.value.details() or ""


@pytest.mark.parametrize("field", ["principal", "issuer", "subject"])
async def test_identity_fields_are_bounded(host: HostUnderTest, field: str) -> None:
    identity = common_pb2.IdentityRef(**{field: "u" * 65})
    code, details = await _refusal(
        host.sessions.CreateSession(
            session_pb2.CreateSessionRequest(session=session_pb2.Session(identity=identity))
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details == (
        f"session.identity.{field}: 65 bytes exceed the identity field limit of 64 bytes "
        "(--max-identity-bytes)"
    )
    code, details = await _refusal(
        host.sessions.Approve(
            session_pb2.ApproveRequest(
                session="sess-x",
                execution_id="e",
                tool_call_id="t",
                request_seq=1,
                approved=True,
                identity=identity,
            )
        )
    )
    assert (code, details.split(":")[0]) == (grpc.StatusCode.INVALID_ARGUMENT, f"identity.{field}")
    # The limit counts UTF-8 bytes: 22 three-byte characters are 66 bytes.
    wide = common_pb2.IdentityRef(**{field: "\u20ac" * 22})
    code, _ = await _refusal(
        host.sessions.CreateSession(
            session_pb2.CreateSessionRequest(session=session_pb2.Session(identity=wide))
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert await host.store.session_uids() == []
    ok = common_pb2.IdentityRef(**{field: "u" * 64})
    created = await host.sessions.CreateSession(
        session_pb2.CreateSessionRequest(session=session_pb2.Session(identity=ok))
    )
    assert getattr(created.identity, field) == "u" * 64


async def test_inputs_are_bounded_together(host: HostUnderTest) -> None:
    inputs = [text_input("x" * 1500) for _ in range(3)]
    code, details = await _refusal(host.sessions.Exec(session_pb2.ExecRequest(inputs=inputs)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith("inputs: ")
    assert details.endswith("bytes exceed the input size limit of 4096 bytes (--max-input-bytes)")
    assert await host.store.session_uids() == [], "not even the session a sessionless Exec creates"
    done = [u async for u in host.sessions.Exec(session_pb2.ExecRequest(inputs=inputs[:2]))]
    assert done[-1].record.event.kind == common_pb2.EVENT_END


class LongWindedModel:
    """Answers every call with more text than one record may hold."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.calls = 0

    async def complete(
        self, call: common_pb2.ModelCall, on_delta: DeltaCallback | None = None
    ) -> harness_pb2.ModelResult:
        self.calls += 1
        text = "y" * self.size
        return harness_pb2.ModelResult(
            message=common_pb2.Message(
                role="assistant", parts=[common_pb2.Part(text=common_pb2.TextPart(text=text))]
            )
        )


async def test_a_model_answer_over_the_record_limit_fails_the_turn() -> None:
    model = LongWindedModel(SMALL.max_record_bytes + 1)
    async with running_host(MemoryStore(), model=model, limits=SMALL) as host:
        code, details = grpc.StatusCode.OK, ""
        frames: list[session_pb2.ExecUpdate] = []
        try:
            async for update in host.sessions.Exec(session_pb2.ExecRequest(inputs=[text_input("tell me")])):
                frames.append(update)
        except grpc.aio.AioRpcError as exc:
            code, details = exc.code(), exc.details() or ""
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (
            "OUTPUT record of 8236 bytes exceeds the record size limit (--max-record-bytes 8192)" in details
        )
        uid = frames[0].session.metadata.uid
        records = await host.store.read(uid)
        kinds = [common_pb2.EventKind.Name(r.event.kind) for r in records]
        assert kinds == ["EVENT_EXECUTION_START", "EVENT_INPUT", "EVENT_MODEL_CALL", "EVENT_ERROR"]
        assert all(r.event.ByteSize() <= SMALL.max_record_bytes for r in records)
        assert await host.store.verify(uid) == len(records)
        assert model.calls == 1


async def test_executions_are_bounded_per_project_and_per_host(
    host: HostUnderTest, gate: GateHarness
) -> None:
    async def create(project: str) -> str:
        made = await host.sessions.CreateSession(
            session_pb2.CreateSessionRequest(
                session=session_pb2.Session(
                    harness="gate", metadata=common_pb2.ResourceMetadata(project=project)
                )
            )
        )
        return str(made.metadata.uid)

    first, second, other, third = await create("a"), await create("a"), await create("b"), await create("c")
    held = asyncio.create_task(_drain(host, first))
    async with asyncio.timeout(30):
        await gate.entered.wait()
    code, details = await _refusal(
        host.sessions.Exec(session_pb2.ExecRequest(session=second, inputs=[text_input("x")]))
    )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details == (
        "1 executions of project 'a' are running on this host, the limit (--max-project-executions 1); "
        "retry when one ends"
    )
    assert await host.store.read(second) == [], "refused before anything was written"
    gate.entered.clear()
    in_b = asyncio.create_task(_drain(host, other))
    async with asyncio.timeout(30):
        await gate.entered.wait()
    code, details = await _refusal(
        host.sessions.Exec(session_pb2.ExecRequest(session=third, inputs=[text_input("x")]))
    )
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the limit (--max-executions 2)" in details
    # A sessionless Exec is refused before its session is created.
    before = await host.store.session_uids()
    code, _ = await _refusal(host.sessions.Exec(session_pb2.ExecRequest(inputs=[text_input("x")])))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await host.store.session_uids() == before
    gate.release.set()
    await asyncio.wait_for(asyncio.gather(held, in_b), 30)
    # The slots are free again.
    assert (await _drain(host, second))[-1].record.event.kind == common_pb2.EVENT_END


async def _drain(host: HostUnderTest, uid: str) -> list[session_pb2.ExecUpdate]:
    return [
        u async for u in host.sessions.Exec(session_pb2.ExecRequest(session=uid, inputs=[text_input("go")]))
    ]


async def test_a_page_of_sessions_fits_a_default_client() -> None:
    """Sessions near every per-field limit: a page is cut before it would exceed 4 MiB, with a token."""
    labels = {f"k{i:02d}": "v" * 4096 for i in range(64)}
    async with running_host(MemoryStore()) as host:
        for _ in range(24):
            await host.sessions.CreateSession(
                session_pb2.CreateSessionRequest(
                    session=session_pb2.Session(labels=labels, annotations=labels)
                )
            )
        async with grpc.aio.insecure_channel(host.address) as default_client:
            listing = default_client.unary_unary(
                "/agentsessions.v1.Sessions/ListSessions",
                request_serializer=session_pb2.ListSessionsRequest.SerializeToString,
                response_deserializer=session_pb2.ListSessionsResponse.FromString,
            )
            seen: list[str] = []
            token = ""
            pages = 0
            while True:
                page = await listing(session_pb2.ListSessionsRequest(page_size=500, page_token=token))
                pages += 1
                assert page.ByteSize() <= MAX_READABLE_BYTES
                seen += [s.metadata.uid for s in page.sessions]
                token = page.next_page_token
                if not token:
                    break
        assert len(seen) == len(set(seen)) == 24
        assert pages >= 3, "~12 MiB of sessions take several pages"


def test_serve_refuses_a_listener_others_can_reach_without_authentication() -> None:
    """Refused before anything listens: exit 2 with the rule, not a warning once it serves."""
    done = subprocess.run(
        [str(BIN / "agentsessions"), "serve", "--listen", "0.0.0.0:0", "--journal", "memory:"],
        capture_output=True,
        text=True,
        env=repo_env(),
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--listen 0.0.0.0:0 is not a loopback address and no authentication is set" in done.stderr
    assert "--insecure-allow-unauthenticated" in done.stderr
    assert "serving" not in done.stderr
