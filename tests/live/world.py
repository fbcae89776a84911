"""An in-process live host for the LiveSessions tests: the real controller with live settings, the
Sessions and LiveSessions servicers and the idempotency interceptor on a grpc.aio server on a
loopback port, and a gated echo harness the tests hold and release turn by turn."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from grpc import aio

from agentsessions.client import SessionsClient
from agentsessions.ext.v1 import live_pb2, live_pb2_grpc
from agentsessions.harnesses.echo import EchoHarness
from agentsessions.host.controller.controller import Controller
from agentsessions.host.controller.deltas import DeltaBatching
from agentsessions.host.controller.harnesses import HarnessCatalog, StaticHarness
from agentsessions.host.controller.live import LiveSettings
from agentsessions.host.controller.tools import ToolInvoker
from agentsessions.host.harnesslink import RemoteHarness
from agentsessions.host.idempotency import IdempotencyInterceptor
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.models.echo import EchoModel
from agentsessions.host.models.provider import DeltaCallback, ModelProvider
from agentsessions.host.service.live import LiveSessionsServicer
from agentsessions.host.service.sessions import SessionsServicer
from agentsessions.sdk import EventSink, Start, text_message
from agentsessions.sdk.harness import Harness
from agentsessions.v1 import common_pb2, harness_pb2, session_pb2, session_pb2_grpc

K = common_pb2.EventKind
WAIT_S = 30.0
# Short enough that a test of expiry and recovery takes a second, not a quarter of a minute.
TEST_SETTINGS = LiveSettings(lease_ttl_s=1.0, scan_s=0.1, backoff_s=0.05)


class GatedEcho:
    """Echoes its last input, but holds each turn at its start until the test opens the turn's
    gate (by its input text): a session stays busy exactly as long as a test needs it to."""

    def __init__(self) -> None:
        self.started: asyncio.Queue[str] = asyncio.Queue()
        self._gates: dict[str, asyncio.Event] = {}
        self.runs: list[str] = []

    def gate(self, text: str) -> asyncio.Event:
        return self._gates.setdefault(text, asyncio.Event())

    def open(self, text: str) -> None:
        self.gate(text).set()

    def open_all(self) -> None:
        for gate in self._gates.values():
            gate.set()

    async def next_started(self) -> str:
        async with asyncio.timeout(WAIT_S):
            return await self.started.get()

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(
            id="gated",
            version="1",
            models=["echo"],
            capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
        )

    async def run(self, start: Start, sink: EventSink) -> None:
        text = start.last_input_text()
        self.runs.append(text)
        await self.started.put(text)
        async with asyncio.timeout(WAIT_S):
            await self.gate(text).wait()
        await sink.model(common_pb2.ModelCall(model="echo", messages=[text_message("user", text)]))


class CountingModel(EchoModel):
    """The echo model, counting completions."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def complete(
        self, call: common_pb2.ModelCall, on_delta: DeltaCallback | None = None
    ) -> harness_pb2.ModelResult:
        self.calls += 1
        return await super().complete(call, on_delta)


@dataclass
class LiveHost:
    controller: Controller
    store: JournalStore
    address: str
    channel: aio.Channel
    sessions: session_pb2_grpc.SessionsStub
    live: live_pb2_grpc.LiveSessionsStub
    client: SessionsClient
    harness: GatedEcho
    extra: dict[str, object] = field(default_factory=dict)

    async def records(self, uid: str) -> list[common_pb2.LogRecord]:
        return list(await self.store.read(uid))

    async def create(self, harness: str = "gated") -> str:
        session = await self.client.create_session(harness=harness)
        return session.metadata.uid

    async def wait_for(self, uid: str, predicate: object, what: str) -> list[common_pb2.LogRecord]:
        """Follow the session (Watch) until ``predicate(records)`` holds; the records then."""
        assert callable(predicate)
        seen: list[common_pb2.LogRecord] = list(await self.records(uid))
        if predicate(seen):
            return seen
        try:
            async with asyncio.timeout(WAIT_S):
                async for update in self.client.watch(uid, after_seq=seen[-1].seq if seen else 0):
                    if update.HasField("record"):
                        seen.append(update.record)
                        if predicate(seen):
                            return seen
        except TimeoutError:
            raise AssertionError(f"gave up after {WAIT_S} s waiting for {what}") from None
        raise AssertionError(f"the watch ended before {what}")


def ends(records: list[common_pb2.LogRecord]) -> list[common_pb2.LogRecord]:
    return [r for r in records if r.event.kind == K.EVENT_END]


def inputs_in_order(records: list[common_pb2.LogRecord]) -> list[str]:
    return [
        "".join(p.text.text for p in r.event.message.parts) for r in records if r.event.kind == K.EVENT_INPUT
    ]


@contextlib.asynccontextmanager
async def live_host(
    store: JournalStore,
    *,
    settings: LiveSettings = TEST_SETTINGS,
    model: ModelProvider | None = None,
    local: Mapping[str, Harness] | None = None,
    tools: ToolInvoker | None = None,
) -> AsyncIterator[LiveHost]:
    gated = GatedEcho()
    static = {"echo": StaticHarness(EchoHarness()), "gated": StaticHarness(gated)}
    for name, harness in (local or {}).items():
        static[name] = StaticHarness(harness)
    catalog = HarnessCatalog(static, store, RemoteHarness, default="echo")
    # Frames of at most 2 bytes, so even a short echo streams deltas for watchers to see.
    batching = DeltaBatching(max_bytes=2)
    controller = Controller(
        store, catalog, model or EchoModel(), tools, live=settings, delta_batching=batching
    )
    assert controller.live is not None
    await controller.live.start()
    server = aio.server(interceptors=[IdempotencyInterceptor()])
    session_pb2_grpc.add_SessionsServicer_to_server(SessionsServicer(controller), server)
    live_pb2_grpc.add_LiveSessionsServicer_to_server(LiveSessionsServicer(controller), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    address = f"127.0.0.1:{port}"
    channel = aio.insecure_channel(address)
    client = SessionsClient(channel)
    try:
        yield LiveHost(
            controller,
            store,
            address,
            channel,
            session_pb2_grpc.SessionsStub(channel),
            live_pb2_grpc.LiveSessionsStub(channel),
            client,
            gated,
        )
    finally:
        gated.open_all()
        await channel.close()
        await server.stop(None)
        await controller.live.close(1.0)


def exec_request(uid: str, text: str, **fields: object) -> session_pb2.ExecRequest:
    return session_pb2.ExecRequest(session=uid, inputs=[text_message("user", text)], **fields)  # type: ignore[arg-type]


def submit_request(uid: str, text: str, on_busy: int = live_pb2.ON_BUSY_REJECT) -> live_pb2.SubmitRequest:
    return live_pb2.SubmitRequest(exec=exec_request(uid, text), on_busy=on_busy)  # type: ignore[arg-type]
