"""Nothing lost on crash (DESIGN "What real means"; spec 4.1 I1/I3, 4.4, 4.5), with real processes.

A crash-harness turn (tests.support.crash_harness) is stopped at each cut point: after each kind of
record, and inside a model call and a tool call. Then either the host or the harness process is
killed with SIGKILL, brought back, and the session is resumed over the Sessions API. Every case must
end with a journal that verifies, one END for the one execution, the model endpoint asked once per
MODEL_CALL record (plus the one request a killed host abandoned mid-call), each tool effect applied
once per idempotency key, and the usage recorded once per report.
"""

from __future__ import annotations

import asyncio
import itertools

import grpc
import pytest

from agentsessions.v1 import common_pb2, session_pb2
from tests.chaos.scenario import (
    MODEL_CALLS,
    SCRIPT_KINDS,
    CrashScenario,
    kind_names,
    of_kind,
    text_of,
    verify_chain,
    wait_until,
)
from tests.support.crash_harness import CUT_POINTS, REPORT_ID, TOOL_CALL_ID, USAGE, idempotency_key

pytestmark = pytest.mark.e2e

K = common_pb2.EventKind
LK = common_pb2.Lifecycle.Kind


def model_completions(records: list[common_pb2.LogRecord]) -> list[str]:
    """The completion text journaled for each MODEL_CALL (the OUTPUT right after it, if any)."""
    texts: list[str] = []
    for before, after in itertools.pairwise(records):
        if before.event.kind == K.EVENT_MODEL_CALL and after.event.kind == K.EVENT_OUTPUT:
            texts.append(text_of(after.event.message))
    return texts


def assert_recovered(
    world: CrashScenario, records: list[common_pb2.LogRecord], *, cut: str, killed: str
) -> None:
    """The guarantees every recovered crash must show (see the module doc)."""
    names = kind_names(records)
    # The execution's records are exactly one uninterrupted turn's: nothing lost, nothing twice.
    turn_kinds = [r.event.kind for r in records if r.event.kind not in (K.EVENT_ERROR, K.EVENT_LIFECYCLE)]
    assert turn_kinds == SCRIPT_KINDS, names
    # A killed host writes nothing; a killed harness leaves the ERROR its host journaled.
    assert len(of_kind(records, K.EVENT_ERROR)) == (1 if killed == "harness" else 0), names
    # The one lifecycle record is the RESUME marker at the end (refused Resumes write nothing).
    assert of_kind(records, K.EVENT_LIFECYCLE) == records[-1:], names
    assert records[-1].event.lifecycle.kind == LK.LIFECYCLE_RESUME, names
    (start,) = of_kind(records, K.EVENT_EXECUTION_START)
    execution_id = start.event.execution_id
    assert {r.event.execution_id for r in records if r.event.kind != K.EVENT_LIFECYCLE} == {execution_id}
    (end,) = of_kind(records, K.EVENT_END)
    assert end.event.end.state == "COMPLETED"

    # Model calls: one request per MODEL_CALL record, plus the one a killed host left in flight.
    requests = world.model.requests
    abandoned = 1 if (killed == "host" and cut == "during_model_call") else 0
    assert len(requests) == MODEL_CALLS + abandoned, [r.token for r in requests]
    completions = model_completions(records)
    issued = [r.token for r in requests]
    assert len(completions) == MODEL_CALLS
    assert set(completions) <= set(issued), (completions, issued)
    if abandoned:
        # The held request's answer never reached the journal; the re-drive's did.
        held = [r.token for r in requests if r.held]
        assert held and held[0] not in completions
    final = of_kind(records, K.EVENT_OUTPUT)[-1]
    assert text_of(final.event.message) == f"done: {completions[-1]}"

    # Tool effects: one per idempotency key; the executor re-run only when a killed host had it open.
    key = idempotency_key(execution_id)
    assert [e["key"] for e in world.tool_effects()] == [key]
    reruns = 1 if (killed == "host" and cut == "during_tool_call") else 0
    assert [a["key"] for a in world.tool_attempts()] == [key] * (1 + reruns)
    results = of_kind(records, K.EVENT_TOOL_RESULT)
    assert [r.event.result.id for r in results] == [TOOL_CALL_ID, REPORT_ID]
    assert text_of(common_pb2.Message(parts=results[0].event.result.content)).startswith(f"recorded {key}")

    # Usage: once per report.
    usage = of_kind(records, K.EVENT_USAGE)
    assert [u.event.usage for u in usage] == [USAGE, USAGE]


async def finish_and_verify(world: CrashScenario) -> None:
    """Stop the host gracefully, then verify the journal file's hash chains with the CLI."""
    assert await world.host.stop() == 0
    verified = await world.verify_journal()
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.startswith("ok: 1 sessions"), verified.stdout


async def host_killed_at(scenario: CrashScenario, cut: str) -> tuple[str, list[common_pb2.LogRecord]]:
    """Kill -9 the host once the turn reaches ``cut``: the turn's Exec answers UNAVAILABLE. Returns
    the session and the records the client had seen."""
    turn = scenario.exec_turn(cut)
    await scenario.wait_for_cut(turn, cut)
    seen = list(turn.records)
    await scenario.host.kill()
    assert await turn.status() == grpc.StatusCode.UNAVAILABLE
    return turn.session, seen


@pytest.mark.parametrize("cut", CUT_POINTS)
class TestKillHost:
    """kill -9 of the host at each cut point; a new host on the same journal resumes the turn."""

    async def test_resume_completes_without_duplicates(self, scenario: CrashScenario, cut: str) -> None:
        uid, seen = await host_killed_at(scenario, cut)
        await verify_chain(scenario, uid, seen)  # what the crash left verifies
        scenario.release()
        await scenario.host.start()

        # Everything the client saw is durable, byte for byte; nothing else was written.
        assert await scenario.records(uid) == seen
        session = await scenario.resume(uid)
        assert session.exec_state == session_pb2.EXEC_COMPLETED
        records = await scenario.records(uid)
        assert records[: len(seen)] == seen
        assert session.last_seq == records[-1].seq
        assert_recovered(scenario, records, cut=cut, killed="host")
        await verify_chain(scenario, uid, records)


async def harness_killed_at(
    scenario: CrashScenario, cut: str
) -> tuple[str, list[common_pb2.LogRecord], list[common_pb2.LogRecord]]:
    """Kill -9 the harness once the turn reaches ``cut``: the turn's Exec answers INTERNAL. Returns
    the session, the records the client had seen and the records journaled after the kill."""
    turn = scenario.exec_turn(cut)
    await scenario.wait_for_cut(turn, cut)
    uid = turn.session
    seen = list(turn.records)
    await scenario.harness.kill()
    scenario.release()  # a model or tool call the host is inside now returns to a dead stream
    assert await turn.status() == grpc.StatusCode.INTERNAL
    return uid, seen, await scenario.records(uid)


async def resume_completes(
    scenario: CrashScenario, uid: str, failed: list[common_pb2.LogRecord], cut: str
) -> None:
    """Resume (retried while the harness is unreachable) completes the turn the harness kill cut:
    the failed records stay the prefix, the recovery is exact and the chain verifies."""
    session = await scenario.resume_when_reachable(uid)
    assert session.exec_state == session_pb2.EXEC_COMPLETED
    records = await scenario.records(uid)
    assert records[: len(failed)] == failed
    assert_recovered(scenario, records, cut=cut, killed="harness")
    await verify_chain(scenario, uid, records)


@pytest.mark.parametrize("cut", CUT_POINTS)
class TestKillHarness:
    """kill -9 of the harness at each cut point: the turn fails with ERROR journaled; a restarted
    harness lets Resume complete it."""

    async def test_resume_completes_without_duplicates(self, scenario: CrashScenario, cut: str) -> None:
        uid, seen, failed = await harness_killed_at(scenario, cut)
        assert failed[: len(seen)] == seen
        assert failed[-1].event.kind == K.EVENT_ERROR, kind_names(failed)
        assert of_kind(failed, K.EVENT_END) == []

        await scenario.harness.start()
        await resume_completes(scenario, uid, failed, cut)


class TestResumeWhileHarnessDown:
    """Resume while the killed harness is still down fails UNAVAILABLE and writes nothing; once the
    harness is back, the next Resume completes the turn."""

    async def test_unavailable_then_completed(self, scenario: CrashScenario) -> None:
        cut = "after_tool_call"
        uid, _, failed = await harness_killed_at(scenario, cut)

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await scenario.resume(uid)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
        assert await scenario.records(uid) == failed

        await scenario.harness.start()
        # UNAVAILABLE is retryable: the host redials a harness that came back within about a
        # second (spec 5.6), so a client retries; no refused attempt may write anything.
        await resume_completes(scenario, uid, failed, cut)


class TestRepeatedCrashDuringRecovery:
    """The host dies inside a model or tool call, and its successor dies inside the same call while
    re-driving it. The third host completes the turn: the MODEL_CALL or TOOL_CALL intent is still
    journaled once, each incarnation asked the model or ran the tool once, and the effect happened
    once."""

    @pytest.mark.parametrize("cut", ["during_model_call", "during_tool_call"])
    async def test_third_host_completes_the_turn(self, scenario: CrashScenario, cut: str) -> None:
        uid, seen = await host_killed_at(scenario, cut)

        # Second incarnation: not released, so the re-driven call stops at the same place.
        if cut == "during_model_call":
            scenario.model.hold_next()
        await scenario.host.start()
        resuming = asyncio.create_task(scenario.resume(uid))
        if cut == "during_model_call":
            await wait_until("the re-driven model call", scenario.model.held.is_set)
        else:
            await wait_until("the re-driven tool call", lambda: len(scenario.tool_entries()) == 2)
        await scenario.host.kill()
        with pytest.raises(grpc.aio.AioRpcError) as cut_off:
            await resuming
        assert cut_off.value.code() == grpc.StatusCode.UNAVAILABLE
        assert await scenario.verify_store() == {uid: len(seen)}  # the re-drive wrote nothing yet

        scenario.release()
        await scenario.host.start()
        assert await scenario.records(uid) == seen
        await scenario.resume(uid)
        records = await scenario.records(uid)
        assert records[: len(seen)] == seen
        assert [r.event.kind for r in records[:-1]] == SCRIPT_KINDS, kind_names(records)
        assert len(of_kind(records, K.EVENT_MODEL_CALL)) == MODEL_CALLS
        (start,) = of_kind(records, K.EVENT_EXECUTION_START)
        key = idempotency_key(start.event.execution_id)
        assert [e["key"] for e in scenario.tool_effects()] == [key]
        if cut == "during_model_call":
            # Two abandoned requests (one per killed host), then one per MODEL_CALL record.
            assert len(scenario.model.requests) == MODEL_CALLS + 2
            assert len(scenario.tool_attempts()) == 1
        else:
            assert len(scenario.model.requests) == MODEL_CALLS
            assert [a["key"] for a in scenario.tool_attempts()] == [key] * 3
        await verify_chain(scenario, uid, records)


class TestStalledHostIsFenced:
    """A host that stalls mid-turn (alive, not killed) while a second host on the same journal
    resumes the turn: the resume's fence supersedes the stalled writer, so when it wakes its next
    intent is refused before any effect; the turn completes once, through the second host."""

    async def test_woken_writer_writes_nothing(self, scenario: CrashScenario) -> None:
        cut = "after_usage"
        turn = scenario.exec_turn(cut)
        await scenario.wait_for_cut(turn, cut)
        uid = turn.session
        seen = list(turn.records)

        second = scenario.another_host("second")
        try:
            await second.start()
            # The second host's re-drive serves the recorded effects and stops at the same cut.
            resuming = asyncio.ensure_future(
                second.sessions.Resume(session_pb2.ResumeRequest(session=uid), timeout=60)
            )
            await wait_until("the second run to stop", lambda: scenario.harness_stops() == [cut, cut])
            scenario.release()  # both runs go on; only the second host may write

            assert await turn.status() == grpc.StatusCode.ABORTED
            session = await resuming
            assert session.exec_state == session_pb2.EXEC_COMPLETED
            records = [r async for r in second.sessions.Replay(session_pb2.ReplayRequest(session=uid))]
            assert records[: len(seen)] == seen
            assert_recovered(scenario, records, cut=cut, killed="nothing")
            # Everything after the cut was written under the second host's (newer) fence.
            assert {r.fence for r in records[len(seen) :]} == {records[-1].fence}
            assert records[-1].fence > seen[-1].fence
            await verify_chain(scenario, uid, records)
        finally:
            await second.close()


class TestCrashMidTurnRedriveAtMostOnce:
    """Every effect journaled, END missing (the host died first): Resume re-runs the harness against
    the recorded effects only, so it costs no model call and no tool run, keeps the execution id,
    and writes the one END; a second Resume re-drives nothing."""

    async def test_resume_after_crash_before_end(self, scenario: CrashScenario) -> None:
        turn = scenario.exec_turn("after_output")
        await scenario.wait_for_cut(turn, "after_output")
        uid = turn.session
        (start,) = of_kind(turn.records, K.EVENT_EXECUTION_START)
        calls_before = len(scenario.model.requests)
        assert calls_before == MODEL_CALLS

        await scenario.host.kill()
        assert await turn.status() == grpc.StatusCode.UNAVAILABLE
        scenario.release()
        await scenario.host.start()
        assert of_kind(await scenario.records(uid), K.EVENT_END) == []

        await scenario.resume(uid)
        records = await scenario.records(uid)
        assert len(scenario.model.requests) == calls_before  # zero new model calls
        assert len(scenario.tool_attempts()) == 1  # zero new tool runs
        (end,) = of_kind(records, K.EVENT_END)
        assert end.event.execution_id == start.event.execution_id
        assert of_kind(records, K.EVENT_EXECUTION_START) == [start]

        again = await scenario.resume(uid)
        after = await scenario.records(uid)
        assert len(scenario.model.requests) == calls_before
        assert of_kind(after, K.EVENT_END) == [end]
        # Only the second RESUME marker is new.
        assert after[: len(records)] == records
        assert kind_names(after[len(records) :]) == ["EVENT_LIFECYCLE"]
        assert again.exec_state == session_pb2.EXEC_COMPLETED
        await finish_and_verify(scenario)


class TestCrashAfterUsageDoesNotDuplicateAccounting:
    """A USAGE journaled before the crash is not journaled again when the recovered run reports the
    same usage; the next report, which was never journaled, is."""

    async def test_usage_recorded_once_per_report(self, scenario: CrashScenario) -> None:
        turn = scenario.exec_turn("after_usage")
        await scenario.wait_for_cut(turn, "after_usage")
        uid = turn.session
        (first_usage,) = of_kind(turn.records, K.EVENT_USAGE)

        await scenario.host.kill()
        assert await turn.status() == grpc.StatusCode.UNAVAILABLE
        scenario.release()
        await scenario.host.start()
        await scenario.resume(uid)
        records = await scenario.records(uid)

        usage = of_kind(records, K.EVENT_USAGE)
        assert len(usage) == 2, kind_names(records)
        assert usage[0] == first_usage  # the pre-crash record, unchanged
        model_calls = of_kind(records, K.EVENT_MODEL_CALL)
        # One report per model call, each after its call.
        assert [u.seq > m.seq for u, m in zip(usage, model_calls, strict=True)] == [True, True]
        assert usage[1].seq > model_calls[1].seq > usage[0].seq
        total = sum(u.event.usage.input_tokens + u.event.usage.output_tokens for u in usage)
        assert total == 2 * (USAGE.input_tokens + USAGE.output_tokens)
        await finish_and_verify(scenario)
