"""The coding agent under a host's mode: it follows the session's mode, hands every change to the
host, and the host decides, runs and confines (docs/modes.md).

The host runs the scripted model, ``coding_tools:write_file`` (a Python tool, class write) and a
``run_shell`` that is a program the host starts (a [[subprocess]] tool: confined with bubblewrap
where it can, else gated on a person).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

from agentsessions.harnesses.coding import CodingHarness
from agentsessions.host.controller.approval_policy import ApprovalPolicy
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.models.scripted import ScriptedModel, assistant_tool_calls, tool_call_part
from agentsessions.host.tools import tools_config_from_mapping
from agentsessions.sdk.modes import MODE_ANNOTATION
from agentsessions.v1 import common_pb2, session_pb2
from tests.approvals.calls import approve, journal, records, resume, say
from tests.support.host import HostUnderTest, running_host
from tests.tools.bwrap import bwrap_or_skip

K = common_pb2.EventKind
MISSING_BWRAP = "/nonexistent/agentsessions-test/bwrap"


@contextlib.asynccontextmanager
async def coding_host(
    store: JournalStore, tmp_path: Path, model: ScriptedModel, bwrap: str
) -> AsyncIterator[HostUnderTest]:
    roots = [str(tmp_path)]
    document = {
        "python": [
            {
                "target": "agentsessions.harnesses.coding_tools:write_file",
                "class": "write",
                "workspace_arg": "workspace",
                "workspace_roots": roots,
            }
        ],
        "subprocess": [
            {
                "name": "run_shell",
                "command": ["/bin/sh", "-c", "{command}"],
                "workspace_arg": "workspace",
                "workspace_roots": roots,
                "timeout_arg": "timeout_s",
            }
        ],
        "confinement": {"bwrap": bwrap},
    }
    registry = tools_config_from_mapping(document).build_registry(store)
    await registry.start()
    try:
        async with running_host(
            store,
            local={"coding": CodingHarness()},
            model=model,
            tools=registry,
            approval_policy=ApprovalPolicy(),
        ) as host:
            yield host
    finally:
        await registry.stop()


async def coding_session(host: HostUnderTest, mode: str) -> str:
    created: session_pb2.Session = await host.sessions.CreateSession(
        session_pb2.CreateSessionRequest(
            session=session_pb2.Session(harness="coding", annotations={MODE_ANNOTATION: mode})
        )
    )
    return created.metadata.uid


def repo(tmp_path: Path) -> Path:
    workspace = tmp_path / "repo"
    workspace.mkdir()
    (workspace / "README.md").write_text("a repo\n", encoding="utf-8")
    return workspace


def coding_config(workspace: Path, mode: str) -> bytes:
    return json.dumps({"workspace": str(workspace), "mode": mode}).encode()


def build_and_run() -> ScriptedModel:
    return ScriptedModel(
        [
            assistant_tool_calls(
                tool_call_part("w", "write_file", {"path": "hello.py", "content": "print('hello')\n"})
            ),
            assistant_tool_calls(tool_call_part("r", "run_shell", {"command": "python3 hello.py > out.txt"})),
            "Wrote hello.py and ran it.",
        ]
    )


async def test_plan_mode_offers_only_reads_whatever_the_config_says(
    store: JournalStore, tmp_path: Path
) -> None:
    workspace = repo(tmp_path)
    model = ScriptedModel(
        [
            assistant_tool_calls(tool_call_part("w", "write_file", {"path": "x.py", "content": "x"})),
            "I can only read here.",
        ]
    )
    async with coding_host(store, tmp_path, model, MISSING_BWRAP) as host:
        uid = await coding_session(host, "plan")
        recs = records(await host.exec(say(uid, "change it", config=coding_config(workspace, "auto"))))
        offered = [tool.name for tool in model.calls[0].tools]
        assert offered == ["read_file", "list_dir"], "the host's plan, not the config's auto"
        (refusal,) = [r.event.result for r in recs if r.event.kind == K.EVENT_TOOL_RESULT]
        assert refusal.is_error and "not available in plan mode" in refusal.error
        assert not (workspace / "x.py").exists()
        assert recs[-1].event.kind == K.EVENT_END


async def test_auto_mode_hands_changes_to_the_host_which_runs_them_confined(
    store: JournalStore, tmp_path: Path
) -> None:
    bwrap = await bwrap_or_skip()
    workspace = repo(tmp_path)
    async with coding_host(store, tmp_path, build_and_run(), bwrap) as host:
        uid = await coding_session(host, "auto")
        recs = records(
            await host.exec(say(uid, "add and run a hello script", config=coding_config(workspace, "auto")))
        )
        assert recs[-1].event.kind == K.EVENT_END
        decisions = [r.event for r in recs if r.event.kind == K.EVENT_APPROVAL_RESULT]
        assert [(d.approval_result.approved, d.actor.subject) for d in decisions] == [
            (True, "mode:auto"),
            (True, "mode:auto"),
        ], "the mode approved both by itself"
        assert (workspace / "hello.py").read_text(encoding="utf-8") == "print('hello')\n"
        assert (workspace / "out.txt").read_text(encoding="utf-8") == "hello\n"
        shell = [r.event.result for r in recs if r.event.kind == K.EVENT_TOOL_RESULT][-1]
        assert shell.output.fields["confinement"].struct_value.fields["confined"].bool_value is True


async def test_auto_mode_without_bubblewrap_asks_a_person_for_the_shell(
    store: JournalStore, tmp_path: Path
) -> None:
    workspace = repo(tmp_path)
    async with coding_host(store, tmp_path, build_and_run(), MISSING_BWRAP) as host:
        uid = await coding_session(host, "auto")
        updates = await host.exec(
            say(uid, "add and run a hello script", config=coding_config(workspace, "auto"))
        )
        recs = records(updates)
        assert (workspace / "hello.py").exists(), "the write ran: auto approves writes"
        request = [r.event.approval for r in recs if r.event.kind == K.EVENT_APPROVAL_REQUEST][-1]
        assert request.reason == (
            f"unconfinable subprocess: no bubblewrap at {MISSING_BWRAP}; "
            "run_shell for the host's auto mode to decide"
        )
        assert not (workspace / "out.txt").exists(), "the shell waits for a person"

        await approve(host, updates[-1].session.pending_approval, True, "looked at it", session=uid)
        assert (await resume(host, uid)).exec_state == session_pb2.EXEC_COMPLETED
        assert (workspace / "out.txt").read_text(encoding="utf-8") == "hello\n"
        shell = [r.event.result for r in await journal(store, uid) if r.event.kind == K.EVENT_TOOL_RESULT][-1]
        confinement = shell.output.fields["confinement"].struct_value.fields
        assert confinement["confined"].bool_value is False
        assert confinement["detail"].string_value == f"no bubblewrap at {MISSING_BWRAP}"
