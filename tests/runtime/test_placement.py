"""Placement over the wire: the runtime's capabilities against the harness's descriptor, checked at
Exec, Resume and Fork admission. A harness the runtime cannot serve is refused with
FAILED_PRECONDITION and a message saying why and what to do, and nothing is journaled."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Mapping

import grpc
import pytest
from grpc import aio

from agentsessions.harnesses.counter import CounterHarness
from agentsessions.harnesses.echo import EchoHarness
from agentsessions.host.config import HostConfig
from agentsessions.host.controller.controller import Controller
from agentsessions.host.controller.harnesses import HarnessCatalog, StaticHarness
from agentsessions.host.harnesslink import RemoteHarness
from agentsessions.host.journal.memory import MemoryStore
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.models.echo import EchoModel
from agentsessions.host.runtime import InProcessRuntime, RuntimeCapabilities, SnapshotRef
from agentsessions.host.service.sessions import SessionsServicer
from agentsessions.sdk import EventSink, Start
from agentsessions.v1 import (
    common_pb2,
    harness_registry_pb2,
    session_pb2,
    session_pb2_grpc,
)
from tests.runtime.harnesses import GpuHarness
from tests.runtime.hosting import output_texts, served_app, text_input
from tests.support.processes import harness_process, serve_argv

COUNTER = "agentsessions.harnesses.counter:CounterHarness"
CALL_TIMEOUT_S = 60.0


class CapableRuntime(InProcessRuntime):
    """A stand-in for a runtime that snapshots memory and manages GPUs (none is built in), with a
    snapshot handle of its own: placement and SUSPEND markers must follow what it reports."""

    name = "capable"

    def capabilities(self) -> RuntimeCapabilities:
        return RuntimeCapabilities(memory_snapshot=True, gpu_state=True)

    async def snapshot(self, session: str) -> SnapshotRef:
        await super().snapshot(session)
        return SnapshotRef(local=session, external_uri=f"file:///snapshots/{session}", memory=True)


class CrashingCounter(CounterHarness):
    """The counter, crashing mid-turn after its output: leaves the turn interrupted."""

    async def run(self, start: Start, sink: EventSink) -> None:
        await super().run(start, sink)
        raise RuntimeError("the harness process died")


class Stubs:
    def __init__(self, sessions: session_pb2_grpc.SessionsStub) -> None:
        self.sessions = sessions

    async def create(self, harness: str) -> str:
        request = session_pb2.CreateSessionRequest(session=session_pb2.Session(harness=harness))
        session: session_pb2.Session = await self.sessions.CreateSession(request)
        return session.metadata.uid

    async def exec(self, uid: str, text: str = "hi") -> list[session_pb2.ExecUpdate]:
        request = session_pb2.ExecRequest(session=uid, inputs=[text_input(text)])
        return [u async for u in self.sessions.Exec(request, timeout=CALL_TIMEOUT_S)]

    async def last_seq(self, uid: str) -> int:
        session: session_pb2.Session = await self.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid))
        return session.last_seq

    async def records(self, uid: str) -> list[common_pb2.LogRecord]:
        return [r async for r in self.sessions.Replay(session_pb2.ReplayRequest(session=uid))]


@contextlib.asynccontextmanager
async def wired_host(store: JournalStore, static: Mapping[str, StaticHarness]) -> AsyncIterator[Stubs]:
    """The real controller and Sessions servicer over ``static`` harnesses on 127.0.0.1:0."""
    catalog = HarnessCatalog(static, store, RemoteHarness)
    server = aio.server()
    session_pb2_grpc.add_SessionsServicer_to_server(
        SessionsServicer(Controller(store, catalog, EchoModel())), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Stubs(session_pb2_grpc.SessionsStub(channel))
    finally:
        await server.stop(None)


async def refused(call: Awaitable[object]) -> aio.AioRpcError:
    """The status a refused call ends with (the refusal must be FAILED_PRECONDITION)."""
    with pytest.raises(aio.AioRpcError) as failed:
        await call
    assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION, failed.value.details()
    return failed.value


def memory_refusal(details: str, runtime: str) -> bool:
    return (
        "RESUMABILITY_REQUIRES_MEMORY_SNAPSHOT" in details
        and f"({runtime})" in details
        and "STATELESS_REPLAY" in details
        and "docs/runtimes.md" in details
    )


async def test_the_served_counter_is_refused_in_process_and_nothing_is_journaled() -> None:
    async with served_app(HostConfig(journal="memory:")) as host:
        stubs = Stubs(host.sessions)
        uid = await stubs.create("counter")
        error = await refused(stubs.exec(uid))
        details = error.details() or ""
        assert memory_refusal(details, "in-process")
        assert "whenever the host process stops or restarts" in details
        fork = host.sessions.Fork(session_pb2.ForkRequest(session=uid))
        assert memory_refusal((await refused(fork)).details() or "", "in-process")
        assert await stubs.last_seq(uid) == 0
        assert await stubs.records(uid) == []
        listed = await host.sessions.ListSessions(session_pb2.ListSessionsRequest())
        assert [s.metadata.uid for s in listed.sessions] == [uid]  # no fork child
        # The stateless harnesses beside it are served as before.
        echo = await stubs.create("echo")
        updates = await stubs.exec(echo)
        assert output_texts([u.record for u in updates if u.HasField("record")]) == ["echo:hi"]


@pytest.mark.e2e
async def test_a_counter_harness_process_is_refused() -> None:
    config = HostConfig(journal="memory:", harness_processes=[("mem", COUNTER)])
    async with served_app(config) as host:
        stubs = Stubs(host.sessions)
        uid = await stubs.create("mem")
        error = await refused(stubs.exec(uid))
        assert memory_refusal(error.details() or "", "subprocess")
        assert await stubs.last_seq(uid) == 0


@pytest.mark.e2e
async def test_a_remote_counter_is_refused_static_and_registered() -> None:
    async with harness_process(serve_argv(COUNTER)) as served:
        config = HostConfig(journal="memory:", harnesses=[("mem", served.address)])
        async with served_app(config) as host:
            stubs = Stubs(host.sessions)
            uid = await stubs.create("mem")
            error = await refused(stubs.exec(uid))
            assert memory_refusal(error.details() or "", "remote")
            assert "does not own that process" in (error.details() or "")
            assert await stubs.last_seq(uid) == 0

            spec = harness_registry_pb2.HarnessSpec(
                remote=harness_registry_pb2.RemotePlacement(address=served.address)
            )
            await host.registry.RegisterHarness(
                harness_registry_pb2.RegisterHarnessRequest(name="mem-reg", spec=spec)
            )
            registered = await stubs.create("mem-reg")
            error = await refused(stubs.exec(registered))
            assert memory_refusal(error.details() or "", "remote")
            assert await stubs.last_seq(registered) == 0


async def test_resume_onto_a_runtime_without_memory_snapshots_is_refused() -> None:
    """A counter turn interrupted on a memory-capable runtime; the host comes back with the counter
    in-process: Resume and Fork are refused and the journal is left as it was."""
    store = MemoryStore()
    async with wired_host(
        store, {"counter": StaticHarness(CrashingCounter(), runtime=CapableRuntime(EchoHarness()))}
    ) as before:
        uid = await before.create("counter")
        with pytest.raises(aio.AioRpcError) as crashed:
            await before.exec(uid)
        assert crashed.value.code() == grpc.StatusCode.INTERNAL
        head = await before.last_seq(uid)
        assert [r.event.kind for r in await before.records(uid)][-1] == common_pb2.EVENT_ERROR
    async with wired_host(store, {"counter": StaticHarness(CounterHarness())}) as after:
        resume = after.sessions.Resume(session_pb2.ResumeRequest(session=uid))
        assert memory_refusal((await refused(resume)).details() or "", "in-process")
        fork = after.sessions.Fork(session_pb2.ForkRequest(session=uid))
        assert memory_refusal((await refused(fork)).details() or "", "in-process")
        assert await after.last_seq(uid) == head


async def test_placement_follows_the_runtime_capabilities_not_the_harness_kind() -> None:
    """The same counter and GPU harnesses, on a runtime reporting memory snapshots and GPU state,
    are placed: the refusal comes from capabilities, not from a list of harnesses."""
    capable = CapableRuntime(EchoHarness())
    counter = CounterHarness()
    static = {
        "counter": StaticHarness(counter, runtime=capable),
        "gpu": StaticHarness(GpuHarness(), runtime=capable),
        "gpu-here": StaticHarness(GpuHarness()),
    }
    async with wired_host(MemoryStore(), static) as host:
        uid = await host.create("counter")
        texts = [
            output_texts([u.record for u in await host.exec(uid) if u.HasField("record")]) for _ in range(2)
        ]
        assert texts == [["1"], ["2"]]
        gpu = await host.create("gpu")
        assert output_texts([u.record for u in await host.exec(gpu) if u.HasField("record")]) == ["gpu"]
        here = await host.create("gpu-here")
        details = (await refused(host.exec(here))).details() or ""
        assert "requires a GPU" in details and "(in-process)" in details
        assert await host.last_seq(here) == 0


async def test_suspend_records_the_runtime_snapshot() -> None:
    capable = CapableRuntime(EchoHarness())
    static = {"plain": StaticHarness(EchoHarness()), "capable": StaticHarness(EchoHarness(), runtime=capable)}
    async with wired_host(MemoryStore(), static) as host:
        markers: dict[str, common_pb2.Lifecycle] = {}
        for name in static:
            uid = await host.create(name)
            await host.exec(uid)
            await host.sessions.Suspend(session_pb2.SuspendRequest(session=uid))
            last = (await host.records(uid))[-1].event
            assert last.lifecycle.kind == common_pb2.Lifecycle.LIFECYCLE_SUSPEND
            markers[name] = last.lifecycle
            assert markers[name].snapshot_local == uid
        # The in-process runtime, as the reference's local backend: the session uid, no memory.
        assert (markers["plain"].snapshot_external_uri, markers["plain"].snapshot_memory) == ("", False)
        assert markers["capable"].snapshot_external_uri.startswith("file:///snapshots/sess-")
        assert markers["capable"].snapshot_memory is True
