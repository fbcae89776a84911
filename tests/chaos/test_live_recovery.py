"""Automatic recovery with real processes (host, crash harness, model endpoint, effect tool).

The host is killed with SIGKILL mid-turn and started again on the same journal; nobody calls
Resume. The new host takes the dead host's lease and completes the turn from the journal: exactly
one END, the model asked at most once more (the request the dead host abandoned), each tool effect
applied once. A turn that keeps killing its host ends FAILED once the attempts are spent. A keyed
Exec retried across the crash streams the recovered execution. With ``--recover off`` an Exec on
the interrupted session is refused, naming Resume, instead of leaving the execution without END.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from agentsessions.client import SessionsClient
from agentsessions.v1 import common_pb2, session_pb2
from tests.chaos.scenario import (
    MODEL_CALLS,
    PROMPT,
    SCRIPT_KINDS,
    WAIT_LIMIT_S,
    CrashScenario,
    kind_names,
    of_kind,
    started,
    wait_until,
)
from tests.support import crash_harness
from tests.support.chat_completions import ChatCompletionsServer
from tests.support.crash_harness import idempotency_key
from tests.support.host_process import HostProcess

pytestmark = pytest.mark.e2e

K = common_pb2.EventKind
LK = common_pb2.Lifecycle.Kind
ATTEMPTS = 2


class LiveCrashScenario(CrashScenario):
    """The crash scenario with automatic recovery on (as ``agentsessions serve`` defaults)."""

    def recovery_args(self) -> list[str]:
        return ["--recover-attempts", str(ATTEMPTS), "--recover-backoff", "0.1"]


@pytest.fixture
async def live_scenario(
    tmp_path: Path, model_endpoint: ChatCompletionsServer
) -> AsyncIterator[CrashScenario]:
    async with started(LiveCrashScenario, tmp_path, model_endpoint) as world:
        yield world


def is_end(record: common_pb2.LogRecord) -> bool:
    return record.event.kind == K.EVENT_END


def is_resume(record: common_pb2.LogRecord) -> bool:
    return record.event.kind == K.EVENT_LIFECYCLE and record.event.lifecycle.kind == LK.LIFECYCLE_RESUME


async def followed_until(
    address: str, uid: str, after_seq: int, last: Callable[[common_pb2.LogRecord], bool]
) -> list[common_pb2.LogRecord]:
    """Watch the session from ``after_seq`` up to the first record ``last`` accepts; those records."""
    seen: list[common_pb2.LogRecord] = []
    async with SessionsClient.connect(address) as client:
        async with asyncio.timeout(WAIT_LIMIT_S):
            async for update in client.watch(uid, after_seq=after_seq):
                if update.HasField("record"):
                    seen.append(update.record)
                    if last(update.record):
                        return seen
    raise AssertionError("the watch ended first")


def stopped_times(world: CrashScenario, count: int) -> Callable[[], bool]:
    return lambda: len(world.harness_stops()) == count


def crash_request(world: CrashScenario, cut: str, uid: str = "") -> session_pb2.ExecRequest:
    return session_pb2.ExecRequest(
        session=uid,
        harness="crash",
        inputs=[
            common_pb2.Message(role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text=PROMPT))])
        ],
        config=crash_harness.turn_config(world.control, cut),
    )


@pytest.mark.parametrize("cut", ["during_model_call", "after_usage", "during_tool_call", "after_tool_result"])
async def test_a_killed_host_completes_the_turn_by_itself(live_scenario: CrashScenario, cut: str) -> None:
    world = live_scenario
    turn = world.exec_turn(cut)
    await world.wait_for_cut(turn, cut)
    uid = turn.session
    seen = list(turn.records)
    await world.host.kill()
    assert await turn.status() == grpc.StatusCode.UNAVAILABLE
    world.release()
    await world.host.start()

    # Nobody calls anything but Watch: the new host recovers the turn from the journal.
    rest = await followed_until(world.host.address, uid, seen[-1].seq, is_resume)
    records = await world.records(uid)
    assert records == seen + rest  # what the watch saw is the journal, exactly once
    names = kind_names(records)
    turn_kinds = [r.event.kind for r in records if r.event.kind not in (K.EVENT_ERROR, K.EVENT_LIFECYCLE)]
    assert turn_kinds == SCRIPT_KINDS, names
    (end,) = of_kind(records, K.EVENT_END)
    assert end.event.end.state == "COMPLETED"
    assert of_kind(records, K.EVENT_LIFECYCLE) == records[-1:], names  # the RESUME marker, last
    assert of_kind(records, K.EVENT_ERROR) == []  # a killed host writes nothing

    abandoned = 1 if cut == "during_model_call" else 0
    assert len(world.model.requests) == MODEL_CALLS + abandoned
    (start,) = of_kind(records, K.EVENT_EXECUTION_START)
    key = idempotency_key(start.event.execution_id)
    assert [e["key"] for e in world.tool_effects()] == [key]
    reruns = 1 if cut == "during_tool_call" else 0
    assert [a["key"] for a in world.tool_attempts()] == [key] * (1 + reruns)

    assert await world.host.stop() == 0
    verified = await world.verify_journal()
    assert verified.returncode == 0, verified.stderr


async def test_a_turn_that_keeps_killing_its_host_ends_failed_once_the_attempts_are_spent(
    live_scenario: CrashScenario,
) -> None:
    world = live_scenario
    cut = "after_usage"
    turn = world.exec_turn(cut)
    await world.wait_for_cut(turn, cut)
    uid = turn.session
    for attempt in range(1, ATTEMPTS + 1):
        await world.host.kill()
        await world.host.start()
        # The new host recovers the turn, which stops at the same point again: kill it there.
        await wait_until(f"recovery attempt {attempt} to stop at {cut}", stopped_times(world, attempt + 1))
    await world.host.kill()
    await world.host.start()
    records = await world.records(uid)
    if not of_kind(records, K.EVENT_END):
        records += await followed_until(world.host.address, uid, records[-1].seq, is_end)
    (end,) = of_kind(records, K.EVENT_END)
    assert end.event.end.state == "FAILED"
    assert f"automatic recovery gave up after {ATTEMPTS} attempts" in end.event.end.error.description
    assert len(world.harness_stops()) == ATTEMPTS + 1  # no attempt after the budget
    session = await world.host.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid))
    assert session.exec_state == session_pb2.EXEC_FAILED
    # The session takes new turns again.
    world.release()
    async with SessionsClient.connect(world.host.address) as client:
        again = [u async for u in client.stub.Exec(crash_request(world, "", uid))]
    assert again[-1].record.event.end.state == "COMPLETED"


async def test_a_keyed_exec_retried_across_the_crash_streams_the_recovered_execution(
    live_scenario: CrashScenario,
) -> None:
    world = live_scenario
    cut = "after_tool_call"
    request = crash_request(world, cut)
    metadata = (("idempotency-key", "crash-turn"),)
    updates: list[session_pb2.ExecUpdate] = []

    async def first_try() -> None:
        async for update in world.host.sessions.Exec(request, metadata=metadata):
            updates.append(update)

    attempt = asyncio.create_task(first_try())
    await wait_until("the turn to stop at the cut", lambda: world.harness_stops() == [cut])
    await world.host.kill()
    with pytest.raises(grpc.aio.AioRpcError):
        await attempt
    uid = updates[0].session.metadata.uid
    world.release()
    await world.host.start()
    retried = [u async for u in world.host.sessions.Exec(request, metadata=metadata, timeout=WAIT_LIMIT_S)]
    assert retried[0].session.metadata.uid == uid
    streamed = [u.record for u in retried if u.WhichOneof("update") == "record"]
    records = await world.records(uid)
    executions = {r.event.execution_id for r in records if r.event.kind == K.EVENT_EXECUTION_START}
    assert len(executions) == 1
    assert streamed == [r for r in records if r.event.execution_id in executions][: len(streamed)]
    assert streamed[0].seq == 1 and streamed[-1].event.kind == K.EVENT_END
    assert streamed[-1].event.end.state == "COMPLETED"
    assert len(world.model.requests) == MODEL_CALLS


async def interrupted_at(scenario: CrashScenario, cut: str) -> str:
    """A session whose turn a host kill cut at ``cut``, on the host started again; its uid."""
    turn = scenario.exec_turn(cut)
    await scenario.wait_for_cut(turn, cut)
    await scenario.host.kill()
    scenario.release()
    await scenario.host.start()
    return turn.session


async def test_with_recovery_off_an_exec_on_an_interrupted_session_names_resume(
    scenario: CrashScenario,
) -> None:
    uid = await interrupted_at(scenario, "after_model_call")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        _ = [u async for u in scenario.host.sessions.Exec(crash_request(scenario, "", uid))]
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "Resume" in (err.value.details() or "")
    assert len(of_kind(await scenario.records(uid), K.EVENT_EXECUTION_START)) == 1  # nothing written
    await scenario.resume_when_reachable(uid)
    after = [u async for u in scenario.host.sessions.Exec(crash_request(scenario, "", uid))]
    assert after[-1].record.event.end.state == "COMPLETED"
    records = await scenario.records(uid)
    assert [e.event.end.state for e in of_kind(records, K.EVENT_END)] == ["COMPLETED", "COMPLETED"]


async def test_a_session_suspended_with_an_interrupted_turn_stays_suspended(scenario: CrashScenario) -> None:
    """Recovery leaves a session that was suspended on purpose alone; Resume completes its turn."""
    uid = await interrupted_at(scenario, "after_usage")  # recovery off: nothing happens by itself
    await scenario.host.sessions.Suspend(session_pb2.SuspendRequest(session=uid), timeout=WAIT_LIMIT_S)
    suspended = await scenario.records(uid)
    assert suspended[-1].event.lifecycle.kind == LK.LIFECYCLE_SUSPEND
    assert await scenario.host.stop() == 0
    args = [a for a in scenario.host_args if a not in ("--recover", "off")]
    recovering = HostProcess(scenario.journal, scenario.tmp, args, name="recovering")
    await recovering.start()
    try:
        await wait_until(
            "the recoverer to leave the suspended session alone",
            lambda: any('"reason":"suspended"' in line for line in recovering.log_lines),
        )
        async with SessionsClient.connect(recovering.address) as client:
            assert [r async for r in client.replay(uid)] == suspended
            resumed = await client.resume(uid)
            assert resumed.exec_state == session_pb2.EXEC_COMPLETED
            records = [r async for r in client.replay(uid)]
    finally:
        await recovering.close()
    assert [e.event.end.state for e in of_kind(records, K.EVENT_END)] == ["COMPLETED"]
    assert records[-1].event.lifecycle.kind == LK.LIFECYCLE_RESUME
