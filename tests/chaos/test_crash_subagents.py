"""Subagents across ``kill -9`` with real processes: the host (SQLite journal, automatic recovery on),
the delegating and the worker harness each in its own process, the model a scripted chat-completions
endpoint on loopback (in this process, so it outlives the host) and the counting effect tool run by
the host.

A parent delegates to two children; the host is killed at each step and started again on the same
journal, and nobody calls anything but Watch and GetSession: the parent completes with both results,
each child ran one turn with one END, and each child's effect (its one host-run tool call) happened
exactly once. The steps: the parent parked with both children inside their tool call; a child running
past its effect; one child finished (and the other still running) before the parent's wake; and both
children ended, the host killed before it woke the parent (the parent's guard held by an input-less
Exec whose Describe the delegating harness holds, so the host's wake of the parent cannot run).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from agentsessions.client import SessionsClient
from agentsessions.ext.v1 import live_pb2
from agentsessions.host.controller.subagents import child_uid
from agentsessions.v1 import common_pb2, session_pb2
from tests.chaos.scenario import WAIT_LIMIT_S, ExecInFlight, of_kind, verify_journal_file, wait_until
from tests.support import describe_gate, effect_tool, subagent_harnesses
from tests.support.host_process import HarnessProcess, HostProcess
from tests.support.scripted_endpoint import Reply, ScriptedEndpoint, scripted_endpoint

pytestmark = pytest.mark.e2e

K = common_pb2.EventKind
LK = common_pb2.Lifecycle.Kind


class SubagentWorld:
    """Host, harness processes, model endpoint and control directory of one test."""

    def __init__(
        self, tmp: Path, sockets: Path, model: ScriptedEndpoint, extra: tuple[str, ...] = ()
    ) -> None:
        self.control = tmp / "control"
        self.control.mkdir()
        self.journal = tmp / "journal.db"
        self.model = model
        logs = {name: tmp / name for name in ("delegator", "worker")}
        for path in logs.values():
            path.mkdir()
        self.delegator_dir = logs["delegator"]  # the delegator's working directory: its Describe gate
        self.harnesses = [
            HarnessProcess(
                f"tests.support.subagent_harnesses:{cls}", f"unix:{sockets / name}.sock", logs[name]
            )
            for name, cls in (("delegator", "Delegator"), ("worker", "Worker"))
        ]
        args = [
            *(
                arg
                for h, name in zip(self.harnesses, logs, strict=True)
                for arg in ("--harness", f"{name}={h.address}")
            ),
            "--model",
            "scripted",
            "--model-base-url",
            model.base_url,
            "--tool-executor",
            "python:tests.support.effect_tool:record_effect",
            "--recover-backoff",
            "0.1",
            *extra,
        ]
        self.host = HostProcess(self.journal, tmp, args)

    async def start(self) -> None:
        await asyncio.gather(*(h.start() for h in self.harnesses), self.host.start())

    async def close(self) -> None:
        await self.host.close()
        for harness in self.harnesses:
            await harness.close()

    def job(self, name: str, **how: bool) -> str:
        return json.dumps({"name": name, "dir": str(self.control), **how}, sort_keys=True)

    def delegate(self, *jobs: str) -> ExecInFlight:
        """Script the parent's model to propose one task per job, then start its turn."""
        calls = [
            {"id": f"call-{i}", "name": "task", "args": {"prompt": job, "harness": "worker"}}
            for i, job in enumerate(jobs)
        ]
        self.model.script(Reply.completion("", tool_calls=calls))
        request = session_pb2.ExecRequest(
            harness="delegator",
            inputs=[
                common_pb2.Message(
                    role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text="split"))]
                )
            ],
        )
        return ExecInFlight(self.host.sessions.Exec(request))

    def release(self) -> None:
        (self.control / effect_tool.RELEASE).touch()

    def entered(self) -> int:
        return len(effect_tool.read_lines(self.control / effect_tool.ENTERED))

    def stopped(self) -> list[str]:
        path = self.control / subagent_harnesses.STOPPED
        return path.read_text().splitlines() if path.exists() else []

    async def records(self, uid: str) -> list[common_pb2.LogRecord]:
        call = self.host.sessions.Replay(session_pb2.ReplayRequest(session=uid), timeout=WAIT_LIMIT_S)
        return [record async for record in call]

    async def state(self, uid: str) -> int:
        session = await self.host.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid))
        return int(session.exec_state)

    async def until_end(self, uid: str) -> list[common_pb2.LogRecord]:
        """Watch the session until its END; its whole journal then."""
        seen = await self.records(uid)
        if not of_kind(seen, K.EVENT_END):
            async with SessionsClient.connect(self.host.address) as client:
                async with asyncio.timeout(WAIT_LIMIT_S):
                    async for update in client.watch(uid, after_seq=seen[-1].seq if seen else 0):
                        if update.HasField("record") and update.record.event.kind == K.EVENT_END:
                            break
        return await self.records(uid)

    async def verify(self) -> None:
        done = await verify_journal_file(self.journal)
        assert done.returncode == 0, done.stderr


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with scripted_endpoint() as served:
        yield served


@pytest.fixture
def host_flags() -> tuple[str, ...]:
    return ()


@pytest.fixture
async def world(
    tmp_path: Path, endpoint: ScriptedEndpoint, host_flags: tuple[str, ...]
) -> AsyncIterator[SubagentWorld]:
    sockets = Path(tempfile.mkdtemp(prefix="asc-", dir="/tmp"))  # unix socket paths stay short
    made = SubagentWorld(tmp_path, sockets, endpoint, host_flags)
    try:
        await made.start()
        yield made
    finally:
        await made.close()
        shutil.rmtree(sockets, ignore_errors=True)


async def parked_parent(world: SubagentWorld, turn: ExecInFlight) -> tuple[str, str]:
    """The parent's uid and execution once its Exec ended at the park."""
    await turn.status()
    final = turn.updates[-1]
    assert final.WhichOneof("update") == "session", final
    assert final.session.exec_state == session_pb2.EXEC_AWAITING
    return final.session.metadata.uid, final.session.pending_approval.execution_id


async def check_completed(world: SubagentWorld, uid: str, execution: str, names: list[str]) -> None:
    """The parent completed with every child's result; each child ran one turn, its effect once."""
    records = await world.until_end(uid)
    (end,) = of_kind(records, K.EVENT_END)
    assert end.event.end.state == "COMPLETED"
    outputs = of_kind(records, K.EVENT_OUTPUT)
    assert "".join(p.text.text for p in outputs[-1].event.message.parts) == "\n".join(
        f"ok done {n}" for n in names
    )
    assert len(world.model.received) == 1  # the parent's one model call, served from the journal after
    keys = []
    for i in range(len(names)):
        child = child_uid(uid, execution, f"call-{i}")
        kid = await world.records(child)
        (start,) = of_kind(kid, K.EVENT_EXECUTION_START)
        assert [e.event.end.state for e in of_kind(kid, K.EVENT_END)] == ["COMPLETED"]
        keys.append(f"{start.event.execution_id}/effect")
    effects = [e["key"] for e in effect_tool.read_lines(world.control / effect_tool.EFFECTS)]
    assert sorted(effects) == sorted(keys)  # each child's effect exactly once


async def finish(world: SubagentWorld) -> None:
    """Stop the host cleanly; every session's chain verifies, as an operator checks it."""
    assert await world.host.stop() == 0
    await world.verify()


async def restart(world: SubagentWorld) -> None:
    await world.host.kill()
    await world.host.start()


async def test_killed_while_the_parent_is_parked_it_completes_after_both_children(
    world: SubagentWorld,
) -> None:
    turn = world.delegate(world.job("a", hold=True), world.job("b", hold=True))
    uid, execution = await parked_parent(world, turn)
    await wait_until("both children inside their effect", lambda: world.entered() == 2)
    await restart(world)
    world.release()
    await check_completed(world, uid, execution, ["a", "b"])
    await finish(world)


async def test_killed_while_a_child_runs_past_its_effect_the_effect_is_not_repeated(
    world: SubagentWorld,
) -> None:
    turn = world.delegate(world.job("a", stop_after_effect=True), world.job("b", stop_after_effect=True))
    uid, execution = await parked_parent(world, turn)
    await wait_until("both children past their effect", lambda: len(world.stopped()) == 2)
    await restart(world)
    world.release()
    await check_completed(world, uid, execution, ["a", "b"])
    attempts = effect_tool.read_lines(world.control / effect_tool.ATTEMPTS)
    assert len(attempts) == 2  # the recovered children were served their recorded results
    await finish(world)


async def test_a_child_that_finished_before_the_parents_wake_is_not_run_again(world: SubagentWorld) -> None:
    turn = world.delegate(world.job("a"), world.job("b", hold=True))
    uid, execution = await parked_parent(world, turn)
    first = child_uid(uid, execution, "call-0")
    await world.until_end(first)
    await wait_until("the second child inside its effect", lambda: world.entered() == 1)
    assert await world.state(uid) == session_pb2.EXEC_AWAITING  # the last child has not settled
    await restart(world)
    world.release()
    await check_completed(world, uid, execution, ["a", "b"])
    first_records = await world.records(first)
    resumes = [
        r
        for r in first_records
        if r.event.kind == K.EVENT_LIFECYCLE and r.event.lifecycle.kind == LK.LIFECYCLE_RESUME
    ]
    assert resumes == []  # it was not recovered: its turn had ended before the kill
    await finish(world)


@pytest.mark.parametrize("host_flags", [("--harness-describe-max-age", "0")])
async def test_killed_after_the_last_child_ended_before_the_parents_wake_it_is_woken_once(
    world: SubagentWorld,
) -> None:
    turn = world.delegate(world.job("a", hold=True), world.job("b", hold=True))
    uid, execution = await parked_parent(world, turn)
    await wait_until("both children inside their effect", lambda: world.entered() == 2)
    # An input-less Exec on the parked parent holds its guard while the host Describes the delegating
    # harness, which holds that Describe: the host cannot wake the parent until it answers.
    (world.delegator_dir / describe_gate.HOLD).touch()
    holding = ExecInFlight(world.host.sessions.Exec(session_pb2.ExecRequest(session=uid)))
    await wait_until(
        "the parent's Describe at the gate", lambda: describe_gate.held(world.delegator_dir) == 1
    )
    world.release()
    children = [child_uid(uid, execution, f"call-{i}") for i in range(2)]
    for child in children:
        ended = of_kind(await world.until_end(child), K.EVENT_END)
        assert [e.event.end.state for e in ended] == ["COMPLETED"]
    # Both children ended; the parent is not woken: no decision, still waiting.
    assert of_kind(await world.records(uid), K.EVENT_APPROVAL_RESULT) == []
    assert await world.state(uid) == session_pb2.EXEC_AWAITING

    await world.host.kill()
    await holding.status()
    (world.delegator_dir / describe_gate.HOLD).unlink()
    await world.host.start()
    await check_completed(world, uid, execution, ["a", "b"])
    records = await world.records(uid)
    decisions = of_kind(records, K.EVENT_APPROVAL_RESULT)
    assert sorted(d.event.approval_result.tool_call_id for d in decisions) == ["call-0", "call-1"]
    assert {d.event.actor.principal for d in decisions} == {"host:subagents"}
    results = of_kind(records, K.EVENT_TOOL_RESULT)
    assert sorted(r.event.result.id for r in results) == ["call-0", "call-1"]  # no duplicate
    assert [r.event.execution_id for r in of_kind(records, K.EVENT_EXECUTION_START)] == [execution]
    await finish(world)


@pytest.mark.parametrize("host_flags", [("--harness-describe-max-age", "0")])
async def test_killed_after_an_interrupted_parents_end_its_children_are_cancelled_on_restart(
    world: SubagentWorld,
) -> None:
    turn = world.delegate(world.job("a", hold=True), world.job("b", hold=True))
    uid, execution = await parked_parent(world, turn)
    await wait_until("both children inside their effect", lambda: world.entered() == 2)
    children = [child_uid(uid, execution, f"call-{i}") for i in range(2)]
    # The interrupting Submit closes the waiting parent (END{CANCELED}), then admits its new turn,
    # whose Describe the delegating harness holds: the host stands after that END and before it
    # cancels the children (it does so once the new turn is admitted).
    (world.delegator_dir / describe_gate.HOLD).touch()
    async with SessionsClient.connect(world.host.address) as client:
        interrupting = asyncio.ensure_future(
            client.submit(uid, "instead", on_busy=live_pb2.ON_BUSY_INTERRUPT)
        )
        await wait_until(
            "the new turn's Describe at the gate", lambda: describe_gate.held(world.delegator_dir) == 1
        )
        (end,) = of_kind(await world.records(uid), K.EVENT_END)
        assert end.event.execution_id == execution and end.event.end.state == "CANCELED"
        for child in children:
            assert of_kind(await world.records(child), K.EVENT_END) == [], "the children still run"
        await world.host.kill()
        with pytest.raises(grpc.aio.AioRpcError):
            await interrupting
    (world.delegator_dir / describe_gate.HOLD).unlink()
    await world.host.start()
    # Nobody calls anything: the host's subagent scan finds the children of an ended turn.
    for child in children:
        ended = of_kind(await world.until_end(child), K.EVENT_END)
        assert [e.event.end.state for e in ended] == ["CANCELED"]
        reason = ended[0].event.end.error.description
        assert reason.startswith(f"its parent session {uid} ended the turn that started it CANCELED"), reason
        assert "interrupted by a newer turn" in reason
    world.release()  # the children's effect tool lets go: nothing runs any more to use it
    records = await world.records(uid)
    assert [e.event.end.state for e in of_kind(records, K.EVENT_END)] == ["CANCELED"]
    assert of_kind(records, K.EVENT_APPROVAL_RESULT) == [], "nothing decided the interrupted turn's calls"
    assert [r.event.execution_id for r in of_kind(records, K.EVENT_EXECUTION_START)] == [execution]
    await finish(world)


async def test_over_connect_a_bad_call_gets_its_error_and_a_good_one_its_child(world: SubagentWorld) -> None:
    world.model.script(
        Reply.completion(
            "",
            tool_calls=[
                {"id": "call-0", "name": "task", "args": {"prompt": "", "harness": "worker"}},
                {"id": "call-1", "name": "task", "args": {"prompt": world.job("b"), "harness": "worker"}},
            ],
        )
    )
    request = session_pb2.ExecRequest(
        harness="delegator",
        inputs=[
            common_pb2.Message(role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text="go"))])
        ],
    )
    turn = ExecInFlight(world.host.sessions.Exec(request))
    await turn.status()
    uid = turn.session
    records = await world.until_end(uid)
    (end,) = of_kind(records, K.EVENT_END)
    assert end.event.end.state == "COMPLETED"
    text = "".join(p.text.text for p in of_kind(records, K.EVENT_OUTPUT)[-1].event.message.parts)
    assert text == "error task argument 'prompt' must be a non-empty string: the child's input\nok done b"
    await finish(world)


@pytest.mark.parametrize("host_flags", [("--max-executions", "1", "--max-project-executions", "1")])
async def test_a_child_that_cannot_start_is_an_error_result(world: SubagentWorld) -> None:
    # One execution at a time: the parent's own turn holds it, so its child's turn is refused.
    turn = world.delegate(world.job("a"))
    await turn.status()
    records = await world.until_end(turn.session)
    (end,) = of_kind(records, K.EVENT_END)
    assert end.event.end.state == "COMPLETED"
    (result,) = of_kind(records, K.EVENT_TOOL_RESULT)
    assert result.event.result.is_error and result.event.result.code == common_pb2.ToolResult.EXECUTOR_ERROR
    child = child_uid(turn.session, end.event.execution_id, "call-0")
    assert result.event.result.error.startswith(f"subagent {child} could not start: ")
    assert "--max-executions" in result.event.result.error
    assert of_kind(await world.records(child), K.EVENT_EXECUTION_START) == []
    await finish(world)
