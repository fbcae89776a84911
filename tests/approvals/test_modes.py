"""Host-enforced modes over the real service: the session's mode judges every call the host runs.

The harness (ModeHarness) makes whatever calls its config lists, whatever mode the host told it:
the host refuses, gates or runs each by the tool's classes (the host's tool configuration plus the
harness's descriptor tags), journaling ordinary v1 records the harness sees, with reasons. Tools
are real: Python functions writing files, and a program the host starts (confined with bubblewrap
where it can; a missing bubblewrap is simulated by configuring a path that does not exist).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from agentsessions.host.controller.approval_policy import POLICY_PRINCIPAL, ApprovalPolicy
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.tools import ToolRegistry, tools_config_from_mapping
from agentsessions.sdk.approval import DENIED_MESSAGE
from agentsessions.sdk.harness import Harness
from agentsessions.sdk.modes import MODE_ANNOTATION
from agentsessions.v1 import common_pb2, session_pb2
from tests.approvals.calls import approve, config, get, journal, kinds, outputs, records, resume, say
from tests.approvals.mode_harnesses import ModeHarness
from tests.support.host import HostUnderTest, running_host
from tests.support.processes import harness_process, serve_argv
from tests.tools.bwrap import bwrap_or_skip

K = common_pb2.EventKind
MISSING_BWRAP = "/nonexistent/agentsessions-test/bwrap"
ROOT = Path(__file__).resolve().parents[2]


def tools_config(tmp_path: Path, bwrap: str) -> dict[str, Any]:
    """write_note (write), read_note (read-only), jot (unclassified), run (a subprocess)."""
    return {
        "python": [
            {"target": "tests.approvals.mode_harnesses:write_note", "class": "write"},
            {"target": "tests.approvals.mode_harnesses:read_note", "class": "read-only"},
            {"target": "tests.approvals.mode_harnesses:write_note", "name": "jot"},
        ],
        "subprocess": [
            {
                "name": "run",
                "command": ["/bin/sh", "-c", "{script}"],
                "workspace_arg": "workspace",
                "workspace_roots": [str(tmp_path / "work")],
            }
        ],
        "confinement": {"bwrap": bwrap},
    }


@contextlib.asynccontextmanager
async def mode_host(
    store: JournalStore,
    tmp_path: Path,
    *,
    policy: Mapping[str, Any] | None = None,
    bwrap: str = MISSING_BWRAP,
    harness: Harness | None = None,
    remote: Mapping[str, str] | None = None,
) -> AsyncIterator[tuple[HostUnderTest, ToolRegistry]]:
    registry = tools_config_from_mapping(tools_config(tmp_path, bwrap)).build_registry(store)
    await registry.start()
    try:
        async with running_host(
            store,
            local={"moder": harness or ModeHarness()},
            remote=remote,
            tools=registry,
            approval_policy=ApprovalPolicy.from_mapping(dict(policy or {})),
        ) as host:
            yield host, registry
    finally:
        await registry.stop()


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    path = tmp_path / "notes"
    path.mkdir()
    return path


@pytest.fixture
def work(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


async def session(host: HostUnderTest, *, project: str = "", mode: str = "", harness: str = "moder") -> str:
    annotations = {MODE_ANNOTATION: mode} if mode else {}
    created: session_pb2.Session = await host.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            session=session_pb2.Session(
                harness=harness,
                metadata=common_pb2.ResourceMetadata(project=project),
                annotations=annotations,
            )
        )
    )
    return created.metadata.uid


def calls(*specs: dict[str, Any]) -> bytes:
    return config(calls=list(specs))


def seen(recs: list[common_pb2.LogRecord]) -> list[dict[str, Any]]:
    """What ModeHarness recorded after each call."""
    return [json.loads(text) for text in outputs(recs) if text.startswith("{")]


def of_kind(recs: list[common_pb2.LogRecord], kind: int) -> list[common_pb2.Event]:
    return [r.event for r in recs if r.event.kind == kind]


async def test_plan_mode_refuses_a_write_the_harness_asks_for(
    store: JournalStore, tmp_path: Path, notes: Path
) -> None:
    """The project requires plan; the harness is told so and asks for writes anyway, both ways."""
    async with mode_host(store, tmp_path, policy={"projects": {"lab": {"mode": "plan"}}}) as (host, _):
        uid = await session(host, project="lab")
        got = await get(host, uid)
        assert got.annotations[MODE_ANNOTATION] == "plan", "the session records the project's mode"
        updates = await host.exec(
            say(
                uid,
                "go",
                config=calls(
                    {"tool": "write_note", "mediation": "approval", "args": {"dir": str(notes)}},
                    {"tool": "write_note", "mediation": "mediated", "args": {"dir": str(notes)}},
                    {"tool": "jot", "mediation": "mediated", "args": {"dir": str(notes)}},
                    {"tool": "read_note", "mediation": "mediated", "args": {"dir": str(notes)}},
                ),
            )
        )
        recs = records(updates)
        assert kinds(recs) == [
            "EXECUTION_START",
            "INPUT",
            "TOOL_CALL",
            "APPROVAL_REQUEST",
            "APPROVAL_RESULT",
            "TOOL_RESULT",
            "OUTPUT",
            "TOOL_CALL",
            "TOOL_RESULT",
            "OUTPUT",
            "TOOL_CALL",
            "TOOL_RESULT",
            "OUTPUT",
            "TOOL_CALL",
            "TOOL_RESULT",
            "OUTPUT",
            "END",
        ]
        assert not (notes / "note.txt").exists(), "no write ran"
        decision = recs[4].event
        assert not decision.approval_result.approved
        assert (decision.actor.principal, decision.actor.subject) == (POLICY_PRINCIPAL, "mode:plan")
        reason = decision.approval_result.reason
        assert reason.startswith("plan mode: write_note is a write tool")
        assert recs[5].event.result.code == common_pb2.ToolResult.APPROVAL_DENIED

        harness_saw = seen(recs)
        assert [s["host_mode"] for s in harness_saw] == ["plan"] * 4, "the harness was told the mode"
        assert harness_saw[0]["decision"] == {"approved": False, "reason": reason}
        assert harness_saw[0]["receipt"]["error"] == DENIED_MESSAGE
        mediated = harness_saw[1]["receipt"]
        assert mediated["is_error"] and mediated["code"] == "EXECUTOR_ERROR"
        assert mediated["output"]["refused"]["mode"] == "plan"
        assert mediated["output"]["refused"]["needs_approval"] is False
        assert mediated["error"].startswith("refused by the host: plan mode: write_note is a write tool")
        unclassified = harness_saw[2]["receipt"]
        assert "jot is not classified by the host (counted as a write tool)" in unclassified["error"]
        read = harness_saw[3]["receipt"]
        assert not read["is_error"] and read["output"] == {"text": ""}, "a read-only tool runs in plan"

        # The refusals are records: a controller replay serves them and writes nothing.
        before = await journal(store, uid)
        report = await host.controller.replay(uid)
        assert (report.executions, report.model_calls) == (1, 0)
        assert await journal(store, uid) == before


async def test_the_session_annotation_sets_the_mode_and_only_tightens_the_project(
    store: JournalStore, tmp_path: Path, notes: Path
) -> None:
    policy = {"projects": {"lab": {"mode": "ask-before"}}}
    async with mode_host(store, tmp_path, policy=policy) as (host, _):
        looser = await session(host, project="lab", mode="auto")
        assert (await get(host, looser)).annotations[MODE_ANNOTATION] == "ask-before"
        stricter = await session(host, project="lab", mode="plan")
        assert (await get(host, stricter)).annotations[MODE_ANNOTATION] == "plan"
        elsewhere = await session(host, mode="plan")  # a project with no mode of its own
        recs = records(
            await host.exec(
                say(
                    elsewhere,
                    "go",
                    config=calls(
                        {"tool": "write_note", "mediation": "mediated", "args": {"dir": str(notes)}}
                    ),
                )
            )
        )
        assert seen(recs)[0]["receipt"]["output"]["refused"]["mode"] == "plan"
        assert not (notes / "note.txt").exists()

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await session(host, mode="careful")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"session.annotations['{MODE_ANNOTATION}']" in (err.value.details() or "")
        assert "plan, ask-before, allow-edits, auto" in (err.value.details() or "")


async def test_ask_before_gates_writes_with_the_modes_reason(
    store: JournalStore, tmp_path: Path, notes: Path
) -> None:
    async with mode_host(store, tmp_path) as (host, _):
        uid = await session(host, mode="ask-before")
        first = await host.exec(
            say(
                uid,
                "go",
                config=calls(
                    {"tool": "write_note", "mediation": "mediated", "args": {"dir": str(notes), "name": "a"}},
                    {"tool": "write_note", "mediation": "approval", "args": {"dir": str(notes), "name": "b"}},
                ),
            )
        )
        recs = records(first)
        refused = seen(recs)[0]["receipt"]
        assert refused["output"]["refused"]["needs_approval"] is True
        assert refused["error"].endswith("ask for approval (REQUIRES_APPROVAL) to run it")
        assert not (notes / "a").exists()
        request = of_kind(recs, K.EVENT_APPROVAL_REQUEST)[0].approval
        assert request.reason == "ask-before mode: write_note is a write tool, which needs approval"
        ref = first[-1].session.pending_approval
        assert ref.request_seq > 0 and not (notes / "b").exists(), "it waits for a person"

        await approve(host, ref, True, "fine", session=uid)
        assert (await resume(host, uid)).exec_state == session_pb2.EXEC_COMPLETED
        assert (notes / "b").read_text(encoding="utf-8") == ""
        after = seen(await journal(store, uid))[-1]
        assert after["decision"] == {"approved": True, "reason": "fine"}
        assert not after["receipt"]["is_error"]


async def test_allow_edits_decides_the_requests_of_tools_the_harness_classifies(
    store: JournalStore, tmp_path: Path, notes: Path, work: Path
) -> None:
    """Declaring write_note's class hands its requests to the mode; an undeclared tool's request
    still waits for a person, and a subprocess still needs one."""
    harness = ModeHarness({"write_note": ["write"], "run": ["subprocess"]})
    async with mode_host(store, tmp_path, harness=harness) as (host, _):
        uid = await session(host, mode="allow-edits")
        updates = await host.exec(
            say(
                uid,
                "go",
                config=calls(
                    {
                        "tool": "write_note",
                        "mediation": "approval",
                        "args": {"dir": str(notes), "text": "ok"},
                    },
                    {
                        "tool": "run",
                        "mediation": "mediated",
                        "args": {"script": "true", "workspace": str(work)},
                    },
                    {"tool": "jot", "mediation": "approval", "args": {"dir": str(notes), "name": "jotted"}},
                ),
            )
        )
        recs = records(updates)
        decision = of_kind(recs, K.EVENT_APPROVAL_RESULT)[0]
        assert decision.approval_result.approved and decision.actor.subject == "mode:allow-edits"
        assert decision.approval_result.reason == (
            "allow-edits mode: write_note is a write tool, which runs without approval"
        )
        assert (notes / "note.txt").read_text(encoding="utf-8") == "ok"
        harness_saw = seen(recs)
        assert harness_saw[0]["decision"]["reason"] == decision.approval_result.reason
        run = harness_saw[1]["receipt"]["output"]["refused"]
        assert run["needs_approval"] is True and "allow-edits mode: run is a subprocess tool" in run["reason"]
        assert updates[-1].session.pending_approval.request_seq > 0, "jot is not the harness's to hand over"
        assert not (notes / "jotted").exists()


async def test_a_subprocess_without_bubblewrap_is_gated_and_the_receipt_says_so(
    store: JournalStore, tmp_path: Path, work: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """auto mode would run the subprocess; with no bubblewrap it needs a person, and the receipt
    of the approved run says it ran unconfined, and why."""
    caplog.set_level(logging.INFO, logger="agentsessions.host")
    async with mode_host(store, tmp_path, bwrap=MISSING_BWRAP) as (host, registry):
        profile = await registry.profile("run")
        assert profile is not None and profile.confinement is not None
        assert not profile.confinement.confined
        uid = await session(host, mode="auto")
        script = {"script": "echo ran > ran.txt", "workspace": str(work)}
        first = await host.exec(
            say(
                uid,
                "go",
                config=calls(
                    {"tool": "run", "mediation": "mediated", "args": script, "id": "m"},
                    {"tool": "run", "mediation": "approval", "args": script, "id": "a"},
                ),
            )
        )
        recs = records(first)
        refused = seen(recs)[0]["receipt"]["output"]["refused"]
        assert refused["needs_approval"] is True
        assert refused["reason"] == f"unconfinable subprocess: no bubblewrap at {MISSING_BWRAP}"
        assert not (work / "ran.txt").exists()
        request = of_kind(recs, K.EVENT_APPROVAL_REQUEST)[0].approval
        assert request.reason == f"unconfinable subprocess: no bubblewrap at {MISSING_BWRAP}"

        await approve(host, first[-1].session.pending_approval, True, "run it as it is", session=uid)
        await resume(host, uid)
        assert (work / "ran.txt").read_text(encoding="utf-8") == "ran\n"
        receipt = seen(await journal(store, uid))[-1]["receipt"]
        assert receipt["output"]["confinement"] == {
            "confined": False,
            "detail": f"no bubblewrap at {MISSING_BWRAP}",
        }
        assert receipt["approval_decision_seq"] > 0
        assert any("running unconfined (after approval)" in r.getMessage() for r in caplog.records)


async def test_auto_mode_runs_a_declared_subprocess_confined(
    store: JournalStore, tmp_path: Path, work: Path
) -> None:
    bwrap = await bwrap_or_skip()
    async with mode_host(store, tmp_path, bwrap=bwrap) as (host, _):
        uid = await session(host, mode="auto")
        recs = records(
            await host.exec(
                say(
                    uid,
                    "go",
                    config=calls(
                        {
                            "tool": "run",
                            "mediation": "approval",
                            "args": {"script": "echo ran > ran.txt", "workspace": str(work)},
                        }
                    ),
                )
            )
        )
        decision = of_kind(recs, K.EVENT_APPROVAL_RESULT)[0]
        assert decision.approval_result.approved and decision.actor.subject == "mode:auto"
        assert "runs confined: bubblewrap" in decision.approval_result.reason
        receipt = seen(recs)[0]["receipt"]
        assert receipt["output"]["confinement"]["confined"] is True
        assert "no network" in receipt["output"]["confinement"]["detail"]
        assert (work / "ran.txt").read_text(encoding="utf-8") == "ran\n"


async def test_writes_outside_the_workspace_roots_need_approval(
    store: JournalStore, tmp_path: Path, work: Path
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (work / "escape").symlink_to(outside)
    async with mode_host(store, tmp_path) as (host, _):
        uid = await session(host)  # no mode: the workspace roots still hold
        recs = records(
            await host.exec(
                say(
                    uid,
                    "go",
                    config=calls(
                        {
                            "tool": "run",
                            "mediation": "mediated",
                            "args": {"script": "true", "workspace": str(outside)},
                        },
                        {
                            "tool": "run",
                            "mediation": "mediated",
                            "args": {"script": "true", "workspace": str(work / "escape")},
                        },
                    ),
                )
            )
        )
        reasons = [s["receipt"]["output"]["refused"]["reason"] for s in seen(recs)]
        assert f"writes outside the workspace: workspace {str(outside)!r} is not under {work}" in reasons[0]
        assert "writes outside the workspace" in reasons[1], "a symlink out of the root counts as outside"


async def test_a_mode_refusal_holds_after_a_persons_approval(
    store: JournalStore, tmp_path: Path, notes: Path
) -> None:
    """Approved under ask-before, then the project requires plan: the approved write does not run."""
    write = calls({"tool": "write_note", "mediation": "approval", "args": {"dir": str(notes)}})
    async with mode_host(store, tmp_path, policy={"mode": "ask-before"}) as (host, _):
        uid = await session(host)
        parked = await host.exec(say(uid, "go", config=write))
        await approve(host, parked[-1].session.pending_approval, True, "yes", session=uid)
    async with mode_host(store, tmp_path, policy={"mode": "plan"}) as (host, _):
        assert (await resume(host, uid)).exec_state == session_pb2.EXEC_COMPLETED
    assert not (notes / "note.txt").exists()
    receipt = of_kind(await journal(store, uid), K.EVENT_TOOL_RESULT)[0].result
    assert receipt.is_error and receipt.code == common_pb2.ToolResult.EXECUTOR_ERROR
    assert receipt.approval_decision_seq > 0, "a valid receipt of an approved call"
    assert "plan mode: write_note is a write tool" in receipt.error


async def test_the_mode_and_the_decisions_reason_reach_a_harness_over_the_wire(
    store: JournalStore, tmp_path: Path, notes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    served = harness_process(serve_argv("tests.approvals.mode_harnesses:ModeHarness"))
    async with served as proc, mode_host(store, tmp_path, remote={"wired": proc.address}) as (host, _):
        uid = await session(host, mode="plan", harness="wired")
        write = {"tool": "write_note", "mediation": "approval", "args": {"dir": str(notes)}}
        recs = records(await host.exec(say(uid, "go", config=calls(write))))
        harness_saw = seen(recs)[0]
        assert harness_saw["host_mode"] == "plan"
        assert harness_saw["decision"]["approved"] is False
        assert harness_saw["decision"]["reason"].startswith("plan mode: write_note is a write tool")
        assert kinds(recs)[-1] == "END"
        report = await host.controller.replay(uid)
        assert report.model_calls == 0
    assert not (notes / "note.txt").exists()
