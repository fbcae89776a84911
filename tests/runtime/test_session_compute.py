"""Exec, Suspend, Resume, Fork and DeleteSession go through the runtime that places the session's
harness: it attaches the session before a turn (create), checkpoints it (snapshot), brings it back
from the session's own snapshot (restore), gives fork children compute (fork) and releases it
(stop). With ``--harness-process`` that is the harness process itself: a session's compute is the
process, which stops when its last live session is suspended or deleted and starts again when one
is resumed or runs a turn."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

import pytest

from agentsessions.harnesses.echo import EchoHarness
from agentsessions.host.config import HostConfig
from agentsessions.host.controller.harnesses import StaticHarness
from agentsessions.host.journal.memory import MemoryStore
from agentsessions.host.runtime import Incarnation, InProcessRuntime, ProcessRuntime, SnapshotRef
from agentsessions.v1 import common_pb2, session_pb2
from tests.runtime.hosting import ServedApp, output_texts, pid_is_gone, served_app, text_input
from tests.runtime.test_placement import Stubs, wired_host

PID = "tests.runtime.harnesses:PidHarness"
CALL_TIMEOUT_S = 60.0
LIVE, COLD, TERMINATED = session_pb2.COMPUTE_LIVE, session_pb2.COMPUTE_COLD, session_pb2.COMPUTE_TERMINATED


class RecordingRuntime(InProcessRuntime):
    """The in-process runtime, noting each Runtime call the host makes (in order)."""

    def __init__(self) -> None:
        super().__init__(EchoHarness())
        self.calls: list[tuple[str, str]] = []

    async def create(self, session: str) -> Incarnation:
        self.calls.append(("create", session))
        return await super().create(session)

    async def snapshot(self, session: str) -> SnapshotRef:
        self.calls.append(("snapshot", session))
        return await super().snapshot(session)

    async def restore(self, ref: SnapshotRef) -> Incarnation:
        self.calls.append(("restore", ref.local))
        return await self._attach(ref.local)

    async def fork(self, ref: SnapshotRef, child: str) -> Incarnation:
        self.calls.append((f"fork from {ref.local}", child))
        return await self._attach(child)

    async def stop(self, session: str) -> None:
        self.calls.append(("stop", session))
        await super().stop(session)

    async def _attach(self, session: str) -> Incarnation:
        # What the base restore and fork do, without their create showing up as a call of its own.
        return await InProcessRuntime.create(self, session)


async def test_each_lifecycle_call_goes_through_the_session_runtime() -> None:
    runtime = RecordingRuntime()
    static = {"echo": StaticHarness(EchoHarness()), "placed": StaticHarness(EchoHarness(), runtime=runtime)}
    async with wired_host(MemoryStore(), static) as host:
        uid = await host.create("placed")
        assert output_texts([u.record for u in await host.exec(uid) if u.HasField("record")]) == ["echo:hi"]
        assert runtime.calls == [("create", uid)]
        assert await runtime.status(uid) == LIVE

        await host.sessions.Suspend(session_pb2.SuspendRequest(session=uid))
        assert runtime.calls[-1] == ("snapshot", uid) and await runtime.status(uid) == COLD
        await host.sessions.Resume(session_pb2.ResumeRequest(session=uid))
        assert runtime.calls[-1] == ("restore", uid) and await runtime.status(uid) == LIVE

        forked = await host.sessions.Fork(session_pb2.ForkRequest(session=uid, count=2))
        children = [c.metadata.uid for c in forked.children]
        assert runtime.calls[-2:] == [(f"fork from {uid}", children[0]), (f"fork from {uid}", children[1])]
        assert [await runtime.status(c) for c in children] == [LIVE, LIVE]

        await host.sessions.DeleteSession(session_pb2.DeleteSessionRequest(uid=children[1]))
        assert runtime.calls[-1] == ("stop", children[1]) and await runtime.status(children[1]) == TERMINATED
        # A harness on another runtime is never asked about this one's sessions.
        other = await host.create("echo")
        await host.exec(other)
        assert all(session != other for _, session in runtime.calls)


async def test_resume_restores_the_session_own_snapshot_not_an_inherited_one() -> None:
    """A fork child's journal starts with its parent's SUSPEND marker; restoring the child from it
    would hand the child the parent's compute."""
    runtime = RecordingRuntime()
    static = {"placed": StaticHarness(EchoHarness(), runtime=runtime)}
    async with wired_host(MemoryStore(), static) as host:
        parent = await host.create("placed")
        await host.exec(parent)
        await host.sessions.Suspend(session_pb2.SuspendRequest(session=parent))
        forked = await host.sessions.Fork(session_pb2.ForkRequest(session=parent))
        (child,) = [c.metadata.uid for c in forked.children]
        inherited = [r.event.lifecycle for r in await host.records(child) if r.event.HasField("lifecycle")]
        assert inherited[0].kind == common_pb2.Lifecycle.LIFECYCLE_SUSPEND
        assert inherited[0].snapshot_local == parent
        await host.sessions.Resume(session_pb2.ResumeRequest(session=child))
        assert runtime.calls[-1] == ("restore", child)


async def test_a_runtime_remembers_only_its_most_recently_attached_sessions() -> None:
    runtime = InProcessRuntime(EchoHarness())
    runtime.max_sessions = 2
    for uid in ("sess-a", "sess-b", "sess-c"):
        await runtime.create(uid)
    assert [await runtime.status(u) for u in ("sess-a", "sess-b", "sess-c")] == [
        session_pb2.COMPUTE_NONE,
        LIVE,
        LIVE,
    ]
    await runtime.create("sess-b")  # attached again: now the most recent
    await runtime.snapshot("sess-d")
    assert [await runtime.status(u) for u in ("sess-b", "sess-c", "sess-d")] == [
        LIVE,
        session_pb2.COMPUTE_NONE,
        COLD,
    ]


async def exec_on(host: ServedApp, uid: str) -> list[str]:
    request = session_pb2.ExecRequest(session=uid, inputs=[text_input("hi")])
    updates = [u async for u in host.sessions.Exec(request, timeout=CALL_TIMEOUT_S)]
    return output_texts([u.record for u in updates if u.HasField("record")])


async def compute_state(host: ServedApp, uid: str) -> int:
    session = await host.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid))
    return int(session.compute_state)


@contextlib.asynccontextmanager
async def pid_host() -> AsyncIterator[tuple[ServedApp, ProcessRuntime, Stubs]]:
    """A host serving ``--harness-process pid=PidHarness`` (whose turns answer with their pid)."""
    config = HostConfig(journal="memory:", harness_processes=[("pid", PID)], drain_grace_seconds=5)
    async with served_app(config) as host:
        yield host, await host.process_runtime("pid"), Stubs(host.sessions)


@pytest.mark.e2e
async def test_the_harness_process_stops_with_its_last_live_session_and_starts_again() -> None:
    async with pid_host() as (host, runtime, stubs):
        uid = await stubs.create("pid")
        first = runtime.pid
        assert first is not None
        assert await exec_on(host, uid) == [f"pid {first}"]
        assert await runtime.status(uid) == LIVE

        # Suspend: the session's compute is checkpointed, and with no other live session the
        # process is stopped (reaped before Suspend answers).
        await host.sessions.Suspend(session_pb2.SuspendRequest(session=uid), timeout=CALL_TIMEOUT_S)
        assert await runtime.status(uid) == COLD
        assert await compute_state(host, uid) == session_pb2.COMPUTE_COLD
        assert runtime.pid is None and pid_is_gone(first)
        assert runtime.restarts == 0  # stopped on purpose, not restarted as after a crash

        # Resume restores the session's compute: a new process, from nothing.
        await host.sessions.Resume(session_pb2.ResumeRequest(session=uid), timeout=CALL_TIMEOUT_S)
        second = runtime.pid
        assert second is not None and second != first and not pid_is_gone(second)
        assert await runtime.status(uid) == LIVE
        assert await exec_on(host, uid) == [f"pid {second}"]

        # DeleteSession releases it; the last live session gone, so is the process.
        await host.sessions.DeleteSession(session_pb2.DeleteSessionRequest(uid=uid), timeout=CALL_TIMEOUT_S)
        assert await runtime.status(uid) == TERMINATED
        assert runtime.pid is None and pid_is_gone(second)

        # A turn of a new session starts it again.
        other = await stubs.create("pid")
        (text,) = await exec_on(host, other)
        assert text == f"pid {runtime.pid}" and runtime.pid not in (first, second)
        assert int(text.removeprefix("pid ")) != os.getpid()


@pytest.mark.e2e
async def test_the_harness_process_keeps_serving_while_a_session_is_live() -> None:
    async with pid_host() as (host, runtime, stubs):
        busy, idle = await stubs.create("pid"), await stubs.create("pid")
        await exec_on(host, busy)
        await exec_on(host, idle)
        pid = runtime.pid
        await host.sessions.Suspend(session_pb2.SuspendRequest(session=idle), timeout=CALL_TIMEOUT_S)
        assert runtime.pid == pid and pid is not None and not pid_is_gone(pid)

        # Fork children get compute on the same process.
        forked = await host.sessions.Fork(session_pb2.ForkRequest(session=busy, count=2))
        children = [c.metadata.uid for c in forked.children]
        assert [await runtime.status(c) for c in children] == [LIVE, LIVE]
        assert await exec_on(host, children[0]) == [f"pid {pid}"]
        assert runtime.pid == pid
