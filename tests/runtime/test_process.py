"""The subprocess runtime in a host built as ``agentsessions serve`` builds it: harness processes
started from ``--harness-process``, turns over Harness.Connect, restart after ``kill -9``, Resume
after the restart, and no process left behind when the host stops."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
from grpc import aio

from agentsessions.host import app, server
from agentsessions.host.config import HostConfig
from agentsessions.host.logs import JsonFormatter
from agentsessions.host.runtime import ProcessRuntime
from agentsessions.v1 import common_pb2, session_pb2, session_pb2_grpc
from tests.runtime.harnesses import REFUSE_FLAG_VARIABLE
from tests.runtime.hosting import (
    READY_TIMEOUT_S,
    REPO,
    ServedApp,
    harness_children,
    output_texts,
    parent_pid,
    pid_is_gone,
    served_app,
    text_input,
)
from tests.support.host_process import HostProcess

PID = "tests.runtime.harnesses:PidHarness"
HANG_ONCE = "tests.runtime.harnesses:HangOnceHarness"
CALL_TIMEOUT_S = 60.0

pytestmark = pytest.mark.e2e


def config(*processes: tuple[str, str]) -> HostConfig:
    return HostConfig(journal="memory:", harness_processes=list(processes), drain_grace_seconds=5)


async def exec_texts(host: ServedApp, harness: str, text: str = "hi") -> tuple[str, list[str]]:
    """Run one Exec on a new session of ``harness``; its uid and the turn's outputs."""
    request = session_pb2.ExecRequest(harness=harness, inputs=[text_input(text)])
    updates = [u async for u in host.sessions.Exec(request, timeout=CALL_TIMEOUT_S)]
    uid = updates[0].session.metadata.uid
    return uid, output_texts([u.record for u in updates if u.HasField("record")])


async def test_a_turn_runs_in_the_started_harness_process_over_connect() -> None:
    async with served_app(config(("pid", PID))) as host:
        runtime = await host.process_runtime("pid")
        assert runtime.address.startswith("unix:")
        uid, outputs = await exec_texts(host, "pid")
        assert outputs == [f"pid {runtime.pid}"]
        assert runtime.pid != os.getpid()
        assert parent_pid(runtime.pid or 0) == os.getpid()
        records = await host.records(uid)
        start = records[0].event.execution_start
        assert (start.harness, start.harness_version) == ("pid", "1")
        assert records[-1].event.kind == common_pb2.EVENT_END


async def test_a_killed_harness_process_is_restarted_and_resume_completes_the_turn(tmp_path: Path) -> None:
    flag = tmp_path / "hang"
    flag.touch()
    async with served_app(config(("hang", HANG_ONCE))) as host:
        runtime = await host.process_runtime("hang")
        first = runtime.pid
        assert first is not None
        request = session_pb2.ExecRequest(
            harness="hang", inputs=[text_input("go")], config=json.dumps({"flag": str(flag)}).encode()
        )
        uid = ""
        with pytest.raises(aio.AioRpcError) as failed:
            async for update in host.sessions.Exec(request, timeout=CALL_TIMEOUT_S):
                if update.HasField("session"):
                    uid = update.session.metadata.uid
                if update.HasField("record") and output_texts([update.record]) == ["before"]:
                    os.kill(first, signal.SIGKILL)  # the harness now hangs mid-turn: kill -9 it
        assert failed.value.code() == grpc.StatusCode.INTERNAL
        async with asyncio.timeout(READY_TIMEOUT_S):
            second = await runtime.ready(replacing=first)
        assert second != first and runtime.restarts == 1
        assert pid_is_gone(first)

        await host.sessions.Resume(session_pb2.ResumeRequest(session=uid), timeout=CALL_TIMEOUT_S)
        records = await host.records(uid)
        kinds = [r.event.kind for r in records]
        assert kinds[-3:] == [common_pb2.EVENT_OUTPUT, common_pb2.EVENT_END, common_pb2.EVENT_LIFECYCLE]
        assert common_pb2.EVENT_ERROR in kinds  # the interrupted attempt, kept for audit
        assert output_texts(records) == ["before", f"after from pid {second}"]
        ids = {r.event.execution_id for r in records if r.event.execution_id}
        assert len(ids) == 1  # the same execution, completed

        # And a later Exec goes to the restarted process too.
        _, outputs = await exec_texts(host, "hang")
        assert outputs == ["before", f"after from pid {second}"]
    assert pid_is_gone(second)


async def test_restarts_back_off_doubling_up_to_the_bound(tmp_path: Path) -> None:
    flag = tmp_path / "refuse"
    runtime = ProcessRuntime(
        "flaky",
        "tests.runtime.harnesses:refusing_start",
        cwd=str(REPO),
        env={**os.environ, REFUSE_FLAG_VARIABLE: str(flag)},
        backoff_initial=0.05,
        backoff_max=0.2,
    )
    failures = asyncio.Event()
    delays: list[float] = []

    class Watch(logging.Handler):
        """The operator's view: the JSON log lines of the restarts."""

        def emit(self, record: logging.LogRecord) -> None:
            line = json.loads(JsonFormatter().format(record))
            delays.append(line.get("restart_in_s", line.get("retry_in_s")))
            if len(delays) >= 5:
                failures.set()

    watch = Watch(logging.WARNING)
    logging.getLogger("agentsessions.runtime").addHandler(watch)
    try:
        await runtime.start()
        first = runtime.pid
        assert first is not None
        flag.touch()  # from now on the harness refuses to start
        os.kill(first, signal.SIGKILL)
        async with asyncio.timeout(READY_TIMEOUT_S):
            await failures.wait()
        assert runtime.pid is None  # nothing serving while restarts fail
        flag.unlink()
        async with asyncio.timeout(READY_TIMEOUT_S):
            second = await runtime.ready(replacing=first)
        assert second != first
    finally:
        logging.getLogger("agentsessions.runtime").removeHandler(watch)
        await runtime.close()
    # The first delay, then doubling per failed start, never beyond the bound.
    assert delays[:5] == [0.05, 0.1, 0.2, 0.2, 0.2]
    assert pid_is_gone(second)


async def test_host_shutdown_stops_its_harness_processes() -> None:
    before = harness_children()
    stop = asyncio.Event()
    up = asyncio.Event()
    bound: list[str] = []

    def serving_on(addresses: Sequence[str]) -> None:
        bound.extend(addresses)
        up.set()

    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        serving = asyncio.create_task(
            server.serve(
                HostConfig(
                    listen="127.0.0.1:0",
                    journal="memory:",
                    harness_processes=[("one", PID), ("two", PID)],
                    drain_grace_seconds=5,
                ),
                stop=stop,
                on_serving=serving_on,
            )
        )
        pids: list[int] = []
        try:
            started = asyncio.create_task(up.wait())
            await asyncio.wait(
                {serving, started}, timeout=READY_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
            )
            started.cancel()
            assert bound, "the host did not start"
            async with aio.insecure_channel(bound[0]) as channel:
                sessions = session_pb2_grpc.SessionsStub(channel)
                for name in ("one", "two"):
                    request = session_pb2.ExecRequest(harness=name, inputs=[text_input("hi")])
                    updates = [u async for u in sessions.Exec(request, timeout=CALL_TIMEOUT_S)]
                    (text,) = output_texts([u.record for u in updates if u.HasField("record")])
                    pids.append(int(text.removeprefix("pid ")))
            assert len(set(pids)) == 2 and all(not pid_is_gone(pid) for pid in pids)
            assert harness_children() - before == set(pids)
        finally:
            stop.set()
            async with asyncio.timeout(CALL_TIMEOUT_S):
                assert await serving == 0
    finally:
        os.chdir(cwd)
    assert all(pid_is_gone(pid) for pid in pids)
    assert harness_children() == before


async def test_harness_processes_stop_by_themselves_when_their_host_is_killed(tmp_path: Path) -> None:
    # A host killed with SIGKILL cannot stop anything: each harness process notices that its
    # standard input (a pipe the host held) closed, and stops gracefully on its own.
    host = HostProcess(tmp_path / "j.db", tmp_path, ["--harness-process", f"one={PID}"])
    await host.start()
    try:
        request = session_pb2.ExecRequest(harness="one", inputs=[text_input("hi")])
        updates = [u async for u in host.sessions.Exec(request, timeout=CALL_TIMEOUT_S)]
        (text,) = output_texts([u.record for u in updates if u.HasField("record")])
        pid = int(text.removeprefix("pid "))
        assert host.process is not None and parent_pid(pid) == host.process.pid
        # Not this test's child, so no wait(): a pidfd becomes readable when the process ends.
        pidfd = os.pidfd_open(pid)
        gone = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(pidfd, gone.set)
        try:
            await host.kill()
            async with asyncio.timeout(CALL_TIMEOUT_S):  # its --grace is 5 s
                await gone.wait()
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)
    finally:
        await host.close()


async def test_a_harness_process_that_cannot_start_fails_host_startup_with_its_error() -> None:
    before = harness_children()
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        with pytest.raises(app.StartupError) as failed:
            await server.serve(
                HostConfig(
                    listen="127.0.0.1:0",
                    journal="memory:",
                    harness_processes=[("good", PID), ("bad", "tests.runtime.no_such_module:Harness")],
                ),
                stop=asyncio.Event(),
            )
    finally:
        os.chdir(cwd)
    message = str(failed.value)
    assert "harness process 'bad'" in message
    assert "exited with code 1 before it was ready" in message
    assert "cannot import 'tests.runtime.no_such_module'" in message
    assert harness_children() == before  # the one that did start was stopped


async def test_admission_takes_the_current_processs_descriptor_and_asks_a_restarted_one() -> None:
    """Describe once per connection holds for a supervised process too: what its process described
    is taken without an await until that process is replaced."""
    runtime = ProcessRuntime("pid", PID, cwd=str(REPO), backoff_initial=0.05)
    supervised = runtime.harness
    try:
        await runtime.start()
        first = runtime.pid
        assert first is not None
        assert supervised.current_descriptor() is None  # nothing described on this connection yet
        described = await supervised.describe()
        assert described.id == "pid"
        assert supervised.current_descriptor() == described
        os.kill(first, signal.SIGKILL)
        async with asyncio.timeout(READY_TIMEOUT_S):
            second = await runtime.ready(replacing=first)
        assert second != first
        assert supervised.current_descriptor() is None  # a new process: admission asks it
        assert await supervised.describe() == described
        assert supervised.current_descriptor() == described
    finally:
        await runtime.close()
    assert supervised.current_descriptor() is None  # stopping: nothing is current


async def test_a_describe_max_age_of_zero_reaches_a_supervised_process() -> None:
    """``--harness-describe-max-age 0`` (the reference's Describe at every admission) holds for the
    host's own harness processes as for dialled ones."""
    async with served_app(
        HostConfig(journal="memory:", harness_processes=[("pid", PID)], harness_describe_max_age=0)
    ) as host:
        runtime = await host.process_runtime("pid")
        assert runtime.describe_max_age == 0
        await runtime.harness.describe()
        assert runtime.harness.current_descriptor() is None  # every admission asks the process
        _, outputs = await exec_texts(host, "pid")
        assert outputs == [f"pid {runtime.pid}"]
