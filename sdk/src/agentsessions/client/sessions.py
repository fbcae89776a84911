"""``SessionsClient``: typed async wrappers over the Sessions and LiveSessions stubs, one channel
factory.

Calls that admit work (``create_session``, ``exec``, ``submit``, ``fork``, ``approve``, ``cancel``)
take ``idempotency_key=``: sent as the ``idempotency-key`` metadata, it makes a retry of the same
request do the work once (a retried ``exec`` streams the original execution from its first record).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Final

import grpc
from grpc import aio

from agentsessions.ext.v1 import live_pb2, live_pb2_grpc
from agentsessions.sdk.harness import text_message
from agentsessions.sdk.limits import MAX_MESSAGE_BYTES
from agentsessions.sdk.tls import open_channel
from agentsessions.v1 import common_pb2, session_pb2, session_pb2_grpc

# Keepalive so long Exec streams notice a dead peer; bounded message size for large replays.
_CHANNEL_OPTIONS = (
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)
IDEMPOTENCY_KEY: Final = "idempotency-key"
# A broken watch stream is opened again after this long (doubling up to the cap).
_RECONNECT_S: Final = 0.2
_RECONNECT_CAP_S: Final = 5.0
_RECONNECT_CODES: Final = frozenset({grpc.StatusCode.UNAVAILABLE})


class SessionsClient:
    """A client of one host. Use ``connect`` (and ``async with``) to own the channel."""

    def __init__(self, channel: aio.Channel, *, metadata: Sequence[tuple[str, str]] = ()) -> None:
        self.channel = channel
        self.stub = session_pb2_grpc.SessionsStub(channel)
        self.live = live_pb2_grpc.LiveSessionsStub(channel)
        self._metadata = tuple(metadata)

    def _keyed(self, idempotency_key: str | None) -> tuple[tuple[str, str], ...]:
        if idempotency_key is None:
            return self._metadata
        return (*self._metadata, (IDEMPOTENCY_KEY, idempotency_key))

    @classmethod
    def connect(
        cls,
        target: str,
        *,
        credentials: grpc.ChannelCredentials | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> SessionsClient:
        """Open a channel to ``target`` (plaintext unless ``credentials`` are given; see
        ``agentsessions.client.tls_credentials``)."""
        return cls(open_channel(target, credentials, _CHANNEL_OPTIONS), metadata=metadata)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> SessionsClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def create_session(
        self,
        *,
        harness: str = "",
        project: str = "",
        name: str = "",
        model: str = "",
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> session_pb2.Session:
        s = session_pb2.Session(
            harness=harness, model=model, labels=dict(labels or {}), annotations=dict(annotations or {})
        )
        s.metadata.project = project
        s.metadata.name = name
        result: session_pb2.Session = await self.stub.CreateSession(
            session_pb2.CreateSessionRequest(session=s), metadata=self._keyed(idempotency_key)
        )
        return result

    async def get_session(self, uid: str) -> session_pb2.Session:
        result: session_pb2.Session = await self.stub.GetSession(
            session_pb2.GetSessionRequest(uid=uid), metadata=self._metadata
        )
        return result

    async def list_sessions(
        self, project: str = "", page_size: int = 0
    ) -> AsyncIterator[session_pb2.Session]:
        """Every session of a project, following page tokens."""
        token = ""
        while True:
            page = await self.stub.ListSessions(
                session_pb2.ListSessionsRequest(project=project, page_size=page_size, page_token=token),
                metadata=self._metadata,
            )
            for s in page.sessions:
                yield s
            token = page.next_page_token
            if not token:
                return

    async def exec(
        self,
        session: str,
        *inputs: str | common_pb2.Message,
        harness: str = "",
        config: bytes = b"",
        resume_from_seq: int = 0,
        expected_last_seq: int | None = None,
        deadline_unix: int = 0,
        idempotency_key: str | None = None,
    ) -> AsyncIterator[session_pb2.ExecUpdate]:
        """Run one turn; yields the session frame, then records and deltas as they come."""
        request = _exec_request(
            session, inputs, harness, config, resume_from_seq, expected_last_seq, deadline_unix
        )
        async for update in self.stub.Exec(request, metadata=self._keyed(idempotency_key)):
            yield update

    async def submit(
        self,
        session: str,
        *inputs: str | common_pb2.Message,
        on_busy: live_pb2.OnBusy.ValueType = live_pb2.ON_BUSY_REJECT,
        harness: str = "",
        config: bytes = b"",
        resume_from_seq: int = 0,
        expected_last_seq: int | None = None,
        deadline_unix: int = 0,
        idempotency_key: str | None = None,
    ) -> live_pb2.SubmitResponse:
        """Admit a turn that runs with no caller (LiveSessions.Submit); returns once it is durably
        admitted (or queued, with ``on_busy=ON_BUSY_ENQUEUE``). Follow it with :meth:`watch`."""
        request = live_pb2.SubmitRequest(
            exec=_exec_request(
                session, inputs, harness, config, resume_from_seq, expected_last_seq, deadline_unix
            ),
            on_busy=on_busy,
        )
        result: live_pb2.SubmitResponse = await self.live.Submit(
            request, metadata=self._keyed(idempotency_key)
        )
        return result

    async def watch(
        self,
        session: str,
        *,
        after_seq: int = 0,
        follow: bool = True,
        include_deltas: bool = False,
        reconnect: bool = True,
    ) -> AsyncIterator[live_pb2.WatchUpdate]:
        """The session's records with seq > ``after_seq``, then (``follow``) each new one as it
        becomes durable, its state changes and queue, and (``include_deltas``) live deltas
        (LiveSessions.Watch). With ``reconnect`` a stream the host broke (UNAVAILABLE: a restart,
        a lost connection) is opened again after the last record seen, so every record arrives
        exactly once; break out of the loop to stop."""
        last = after_seq
        wait = _RECONNECT_S
        while True:
            request = live_pb2.WatchRequest(
                session=session, after_seq=last, follow=follow, include_deltas=include_deltas
            )
            try:
                async for update in self.live.Watch(request, metadata=self._metadata):
                    wait = _RECONNECT_S
                    if update.HasField("record"):
                        last = update.record.seq
                    yield update
                return
            except grpc.aio.AioRpcError as exc:
                if not reconnect or exc.code() not in _RECONNECT_CODES:
                    raise
            await asyncio.sleep(wait)
            wait = min(_RECONNECT_CAP_S, wait * 2)

    async def replay(
        self, session: str, from_seq: int = 0, to_seq: int = 0
    ) -> AsyncIterator[common_pb2.LogRecord]:
        request = session_pb2.ReplayRequest(session=session, from_seq=from_seq, to_seq=to_seq)
        async for record in self.stub.Replay(request, metadata=self._metadata):
            yield record

    async def approve(
        self,
        ref: common_pb2.ApprovalRef,
        session: str,
        *,
        approved: bool,
        reason: str = "",
        identity: common_pb2.IdentityRef | None = None,
        idempotency_key: str | None = None,
    ) -> session_pb2.ApproveResponse:
        request = session_pb2.ApproveRequest(
            session=session,
            execution_id=ref.execution_id,
            tool_call_id=ref.tool_call_id,
            request_seq=ref.request_seq,
            approved=approved,
            reason=reason,
        )
        if identity is not None:
            request.identity.CopyFrom(identity)
        result: session_pb2.ApproveResponse = await self.stub.Approve(
            request, metadata=self._keyed(idempotency_key)
        )
        return result

    async def suspend(self, session: str) -> session_pb2.Session:
        result: session_pb2.Session = await self.stub.Suspend(
            session_pb2.SuspendRequest(session=session), metadata=self._metadata
        )
        return result

    async def resume(self, session: str) -> session_pb2.Session:
        result: session_pb2.Session = await self.stub.Resume(
            session_pb2.ResumeRequest(session=session), metadata=self._metadata
        )
        return result

    async def fork(
        self,
        session: str,
        *,
        at_seq: int = 0,
        count: int = 1,
        child_names: Sequence[str] = (),
        labels: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> list[session_pb2.Session]:
        response = await self.stub.Fork(
            session_pb2.ForkRequest(
                session=session,
                at_seq=at_seq,
                count=count,
                child_names=list(child_names),
                labels=dict(labels or {}),
            ),
            metadata=self._keyed(idempotency_key),
        )
        return list(response.children)

    async def cancel(
        self, session: str, execution_id: str = "", reason: str = "", *, idempotency_key: str | None = None
    ) -> session_pb2.Session:
        result: session_pb2.Session = await self.stub.Cancel(
            session_pb2.CancelRequest(session=session, execution_id=execution_id, reason=reason),
            metadata=self._keyed(idempotency_key),
        )
        return result

    async def delete_session(self, uid: str) -> session_pb2.Session:
        result: session_pb2.Session = await self.stub.DeleteSession(
            session_pb2.DeleteSessionRequest(uid=uid), metadata=self._metadata
        )
        return result


def _exec_request(
    session: str,
    inputs: Sequence[str | common_pb2.Message],
    harness: str,
    config: bytes,
    resume_from_seq: int,
    expected_last_seq: int | None,
    deadline_unix: int,
) -> session_pb2.ExecRequest:
    request = session_pb2.ExecRequest(
        session=session,
        inputs=[text_message("user", i) if isinstance(i, str) else i for i in inputs],
        harness=harness,
        config=config,
        resume_from_seq=resume_from_seq,
        deadline_unix=deadline_unix,
    )
    if expected_last_seq is not None:
        request.expected_last_seq = expected_last_seq
    return request
