"""The native API's replay rules on the real host: in-process and over a real Harness.Connect
stream (the harness served by the SDK on loopback), with controller replay and the
``agentsessions replay`` command. Each test is a failure a harness author hit with the
protocol-level SDK: concurrent tool calls that replay in another order, an in-harness side effect
repeated by Resume and replay, a park hidden by a framework's exception wrapping, params and usage
that never reached the journal, approvals without reasons, and divergences that did not say what
differed."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentsessions.host.controller.errors import ReplayDivergedError
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.models.provider import DeltaCallback
from agentsessions.host.models.scripted import ScriptedModel, assistant_tool_calls, tool_call_part
from agentsessions.host.tools import CallableTool, PythonCallableExecutor, ToolContext, ToolRegistry
from agentsessions.sdk import (
    ApprovalParkedError,
    Execution,
    HarnessDescriptor,
    Mediation,
    Message,
    NativeHarness,
    ToolSpec,
)
from agentsessions.sdk.execution import DUMP_DIR_ENV
from agentsessions.v1 import common_pb2, harness_pb2, session_pb2
from tests.approvals.calls import approve, journal, kinds, new_session, outputs, records, resume, say
from tests.durability.commands import Command, in_process
from tests.durability.harnesses import served
from tests.support.host import HostUnderTest, running_host

K = common_pb2.EventKind
TOOLS = (
    ToolSpec("append", mediation=Mediation.IN_HARNESS_REPORTED),
    ToolSpec("lookup", mediation=Mediation.CONTROLLER_MEDIATED),
    ToolSpec("deploy", mediation=Mediation.REQUIRES_APPROVAL),
)


@pytest.fixture
def command(capsys: pytest.CaptureFixture[str]) -> Command:
    return in_process(capsys)


class HostTools:
    """Host-run ``lookup`` and ``deploy``, counting their runs."""

    def __init__(self, store: JournalStore) -> None:
        self.runs: list[str] = []
        self.registry = ToolRegistry(
            store,
            [
                PythonCallableExecutor(
                    [CallableTool("lookup", self.lookup), CallableTool("deploy", self.deploy)]
                )
            ],
        )

    async def lookup(self, args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        self.runs.append("lookup:" + str(args.get("key")))
        return {"value": str(args.get("key", "")).upper()}

    async def deploy(self, args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        self.runs.append("deploy")
        return {"deployed": True}


@contextlib.asynccontextmanager
async def hosting(
    store: JournalStore, harness: NativeHarness, transport: str, model: Any, tools: HostTools
) -> AsyncIterator[tuple[HostUnderTest, str]]:
    """A host with ``harness`` as "agent", in-process or over Connect; yields (host, address)."""
    if transport == "in-process":
        async with running_host(store, local={"agent": harness}, model=model, tools=tools.registry) as host:
            yield host, ""
        return
    async with (
        served(harness) as address,
        running_host(store, remote={"agent": address}, model=model, tools=tools.registry) as host,
    ):
        yield host, address


TRANSPORTS = ["in-process", "connect"]


# -- an in-harness side effect happens once -------------------------------------------------------------


class Shipper(NativeHarness):
    """Logs a line with an in-harness tool, then deploys through an approval."""

    descriptor = HarnessDescriptor(id="shipper", version="1", tools=TOOLS)

    def __init__(self, log: Path) -> None:
        super().__init__()
        self.log = log
        self.wrap = ""  # how to hand a park back: "", "cause" or "context"

    def append(self, args: dict[str, Any]) -> dict[str, Any]:
        with self.log.open("a", encoding="utf-8") as out:  # a real, repeatable side effect
            out.write(args["line"] + "\n")
        return {"lines": len(self.log.read_text(encoding="utf-8").splitlines())}

    async def execute(self, ex: Execution) -> None:
        messages = [Message.user(ex.input_text())]
        result = await ex.model(messages)
        log, deploy = result.tool_calls
        await ex.call_tool(log, self.append)
        try:
            shipped = await ex.call_tool(deploy, reason="deploys need a human")
        except ApprovalParkedError as park:
            if self.wrap == "cause":
                raise RuntimeError("the deploy tool failed") from park
            if self.wrap == "context":
                raise RuntimeError("the deploy tool failed")  # noqa: B904 - as a framework would
            raise
        assert shipped.decision is not None
        await ex.output(f"deploy approved: {shipped.decision.reason}")


def ship_script() -> ScriptedModel:
    return ScriptedModel(
        [
            assistant_tool_calls(
                tool_call_part("w1", "append", {"line": "shipping"}),
                tool_call_part("d1", "deploy", {"env": "prod"}),
            )
        ]
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_in_harness_side_effect_happens_once_through_resume_and_replay(
    store: JournalStore, tmp_path: Path, transport: str, command: Command, journal_path: str
) -> None:
    log = tmp_path / "deploy.log"
    harness = Shipper(log)
    tools = HostTools(store)
    model = ship_script()
    async with hosting(store, harness, transport, model, tools) as (host, address):
        uid = await new_session(host, "agent")
        updates = await host.exec(say(uid, "ship it"))
        parked = updates[-1].session
        assert parked.exec_state == session_pb2.EXEC_AWAITING
        assert log.read_text(encoding="utf-8") == "shipping\n"
        recs = await journal(store, uid)
        request = next(r.event.approval for r in recs if r.event.kind == K.EVENT_APPROVAL_REQUEST)
        assert request.reason == "deploys need a human"

        await approve(host, parked.pending_approval, True, "change window is open", session=uid)
        assert (await resume(host, uid)).exec_state == session_pb2.EXEC_COMPLETED
        assert log.read_text(encoding="utf-8") == "shipping\n", "Resume served the recorded result"
        recs = await journal(store, uid)
        assert outputs(recs)[-1] == "deploy approved: change window is open"
        assert [k for k in kinds(recs) if k == "TOOL_RESULT"] == ["TOOL_RESULT", "TOOL_RESULT"]

        report = await host.controller.replay(uid)
        assert (report.executions, report.model_calls) == (1, 0)
        assert log.read_text(encoding="utf-8") == "shipping\n", "replay served the recorded result"
        assert tools.runs == ["deploy"] and len(model.calls) == 1
        if address:
            run = await command(
                "replay", "--journal", journal_path, "--session", uid, "--harness", f"agent={address}"
            )
            assert run.code == 0, run.err
            assert log.read_text(encoding="utf-8") == "shipping\n", "agentsessions replay ran no tool either"


@pytest.mark.parametrize("wrap", ["cause", "context"])
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_park_a_framework_wrapped_still_parks(
    store: JournalStore, tmp_path: Path, transport: str, wrap: str
) -> None:
    harness = Shipper(tmp_path / "deploy.log")
    harness.wrap = wrap
    async with hosting(store, harness, transport, ship_script(), HostTools(store)) as (host, _):
        uid = await new_session(host, "agent")
        updates = await host.exec(say(uid, "ship it"))
        assert updates[-1].session.exec_state == session_pb2.EXEC_AWAITING
        assert kinds(records(updates))[-2:] == ["APPROVAL_REQUEST", "LIFECYCLE"]


# -- completion order ----------------------------------------------------------------------------------


class ConcurrentLookups(NativeHarness):
    """Runs a completion's lookups concurrently; live, the first one starts last."""

    descriptor = HarnessDescriptor(id="concurrent", version="1", tools=TOOLS)

    def __init__(self) -> None:
        super().__init__()
        self.live = True

    async def execute(self, ex: Execution) -> None:
        result = await ex.model([Message.user(ex.input_text())])
        calls = result.tool_calls
        last_started = asyncio.Event()

        async def one(position: int) -> None:
            if position == len(calls) - 1:
                last_started.set()
            elif position == 0 and self.live:
                await last_started.wait()
            await ex.call_tool(calls[position])

        await asyncio.gather(*(one(i) for i in range(len(calls))))


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_concurrent_tool_calls_replay(store: JournalStore, transport: str) -> None:
    harness = ConcurrentLookups()
    tools = HostTools(store)
    model = ScriptedModel(
        [assistant_tool_calls(*(tool_call_part(i, "lookup", {"key": i}) for i in ("a", "b", "c"))), "found"]
    )
    async with hosting(store, harness, transport, model, tools) as (host, _):
        uid = await new_session(host, "agent")
        await host.exec(say(uid, "look them up"))
        recs = await journal(store, uid)
        assert [r.event.tool.id for r in recs if r.event.kind == K.EVENT_TOOL_CALL] == ["a", "b", "c"]
        harness.live = False  # the replay's scheduling differs; the journal order must not matter
        report = await host.controller.replay(uid)
        assert (report.executions, report.model_calls) == (1, 0)


# -- params, usage, divergence reports, dumps -----------------------------------------------------------


class UsageModel(ScriptedModel):
    """The scripted model, reporting usage with each completion as a real provider does."""

    async def complete(
        self, call: common_pb2.ModelCall, on_delta: DeltaCallback | None = None
    ) -> harness_pb2.ModelResult:
        result = await super().complete(call, on_delta)
        result.usage.CopyFrom(common_pb2.Usage(model="scripted", input_tokens=11, output_tokens=7))
        return result


class Tunable(NativeHarness):
    """One model call with a system prompt and params a test changes between live and replay."""

    descriptor = HarnessDescriptor(id="tunable", version="1")

    def __init__(self) -> None:
        super().__init__()
        self.prompt = "You are terse."
        self.params = {"temperature": "0.2"}

    async def execute(self, ex: Execution) -> None:
        result = await ex.model(
            [Message.system(self.prompt), Message.user(ex.input_text())], params=self.params
        )
        assert result.usage is not None
        await ex.usage(result.usage)  # the provider's usage, already journaled: not twice
        await ex.output(f"{result.usage.input_tokens}+{result.usage.output_tokens} tokens")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_params_reach_the_provider_and_usage_is_journaled_once(
    store: JournalStore, transport: str
) -> None:
    model = UsageModel(["hello"])
    async with hosting(store, Tunable(), transport, model, HostTools(store)) as (host, _):
        uid = await new_session(host, "agent")
        await host.exec(say(uid, "hi"))
        recs = await journal(store, uid)
        assert kinds(recs) == ["EXECUTION_START", "INPUT", "MODEL_CALL", "OUTPUT", "USAGE", "OUTPUT", "END"]
        assert dict(recs[2].event.model.params) == {"temperature": "0.2"}
        assert dict(model.calls[0].params) == {"temperature": "0.2"}
        assert recs[4].event.usage == common_pb2.Usage(model="scripted", input_tokens=11, output_tokens=7)
        assert outputs(recs)[-1] == "11+7 tokens"
        report = await host.controller.replay(uid)  # the recorded usage is served, so the output matches
        assert (report.model_calls, len(model.calls)) == (0, 1)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_divergence_says_what_the_journal_can_tell(store: JournalStore, transport: str) -> None:
    harness = Tunable()
    async with hosting(store, harness, transport, UsageModel(["hello"]), HostTools(store)) as (host, _):
        uid = await new_session(host, "agent")
        await host.exec(say(uid, "hi"))
        harness.params = {"temperature": "0.9"}
        with pytest.raises(
            ReplayDivergedError,
            match=r"model call 1: model input hash mismatch .*: params temperature differ",
        ):
            await host.controller.replay(uid)
        harness.params = {"temperature": "0.2"}
        harness.prompt = "You are tense."
        with pytest.raises(ReplayDivergedError) as diverged:
            await host.controller.replay(uid)
        message = str(diverged.value)
        assert "model call 1: model input hash mismatch - harness violated STATELESS_REPLAY (I0)" in message
        assert (
            "its model and params match the journal, so its messages (2), tools (0) or tool choice differ"
            in message
        )
        assert DUMP_DIR_ENV in message


@contextlib.contextmanager
def dumping(monkeypatch: pytest.MonkeyPatch, folder: Path) -> Iterator[Path]:
    monkeypatch.setenv(DUMP_DIR_ENV, str(folder))
    yield folder


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_request_a_replay_would_send_is_dumped_with_its_hash(
    store: JournalStore, tmp_path: Path, transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = Tunable()
    with dumping(monkeypatch, tmp_path / "dumps") as folder:
        async with hosting(store, harness, transport, UsageModel(["hello"]), HostTools(store)) as (host, _):
            uid = await new_session(host, "agent")
            await host.exec(say(uid, "hi"))
            harness.prompt = "You are tense."
            with pytest.raises(ReplayDivergedError):
                await host.controller.replay(uid)
            recorded = next(
                r.event.model for r in await journal(store, uid) if r.event.kind == K.EVENT_MODEL_CALL
            )
    live, replayed = sorted((folder / uid).iterdir())
    assert "-live-" in live.name and "-replay-" in replayed.name
    live_dump, replay_dump = json.loads(live.read_text()), json.loads(replayed.read_text())
    assert live_dump["input_hash"] == recorded.input_hash != replay_dump["input_hash"]
    system = [m for m in replay_dump["request"]["messages"] if m["role"] == "system"]
    assert system[0]["parts"][0]["text"]["text"] == "You are tense."
