"""The coding harness in the SDK's test environment, with the scripted model and the host's
coding tools as the environment's host-run tools.

The environment plays the host: it journals each effect, answers model calls from the script,
parks REQUIRES_APPROVAL calls until the test decides, runs approved calls through the coding_tools
host entry points, re-drives an interrupted execution and replays finished ones.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from agentsessions.harnesses import coding_tools
from agentsessions.harnesses.coding import CodingConfigError, CodingHarness, conversation
from agentsessions.harnesses.coding_tools import SHELL_OUTPUT_LIMIT_BYTES, Workspace
from agentsessions.sdk import Mediation, Message, ModelCall, TextPart, ToolCall, convert
from agentsessions.sdk.callids import completion_call_id, idempotency_key
from agentsessions.sdk.testing import HarnessEnvironment, Outcome, Reply, check_replay
from agentsessions.v1 import common_pb2, harness_pb2

APPROVAL = common_pb2.MEDIATION_REQUIRES_APPROVAL
REPORTED = common_pb2.MEDIATION_IN_HARNESS_REPORTED
K = common_pb2


def host_tool(name: str) -> Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]:
    entry = getattr(coding_tools, name)

    async def run(args: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await entry(args, None)
        return result

    return run


def host_tools() -> dict[str, Any]:
    """The host-side executors the coding harness's gated calls run on."""
    return {name: host_tool(name) for name in ("write_file", "edit_file", "run_shell")}


def environment(script: Sequence[Reply]) -> HarnessEnvironment:
    return HarnessEnvironment(CodingHarness(), model=script, tools=host_tools())


def settings(workspace: Path, mode: str, **config: Any) -> dict[str, Any]:
    return {"workspace": str(workspace), "mode": mode, **config}


def calls(*parts: ToolCall, text: str = "") -> Message:
    """An assistant completion proposing tool calls."""
    return Message("assistant", ((TextPart(text),) if text else ()) + parts)


def call(call_id: str, tool: str, **args: Any) -> ToolCall:
    return ToolCall(id=call_id, name=tool, args=args)


def write(path: str, content: str, call_id: str = "m-1") -> Message:
    return calls(call(call_id, "write_file", path=path, content=content))


def of_kind(outcome: Outcome, kind: int) -> list[common_pb2.Event]:
    return [e for e in outcome.events if e.kind == kind]


def output_of(result: common_pb2.ToolResult) -> dict[str, Any]:
    return convert.dict_from_struct(result.output)


def offered(request: ModelCall) -> list[str]:
    return [tool.name for tool in request.tools]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "README.md").write_text("hello\n", encoding="utf-8")
    return root


async def test_describe() -> None:
    descriptor = await CodingHarness().describe()
    assert (descriptor.id, descriptor.version) == ("coding", "2")
    assert descriptor.capabilities.resumability == harness_pb2.RESUMABILITY_STATELESS_REPLAY
    assert {tool.name: tool.mediation for tool in descriptor.tools} == {
        "read_file": REPORTED,
        "list_dir": REPORTED,
        "write_file": APPROVAL,
        "edit_file": APPROVAL,
        "run_shell": APPROVAL,
    }


async def test_plan_mode_offers_no_write_tools_and_refuses_them(workspace: Path) -> None:
    env = environment([write("new.txt", "x"), "I only looked."])
    outcome = await env.run("please help", config=settings(workspace, "plan"))
    first, second = env.requests
    assert offered(first) == ["read_file", "list_dir"]
    (refusal,) = [e.result for e in of_kind(outcome, K.EVENT_TOOL_RESULT)]
    assert refusal.is_error and refusal.id == "m-1"
    assert "not available in plan mode" in refusal.error
    assert not (workspace / "new.txt").exists()
    assert "TOOL_CALL" not in outcome.kinds()
    # The model saw the refusal, correlated to its own call id.
    (answer,) = second.messages[-1].tool_results
    assert second.messages[-1].role == "tool" and answer.id == "m-1" and answer.is_error


async def test_reads_run_in_the_harness_and_are_reported_before_the_model_sees_them(workspace: Path) -> None:
    script: list[Reply] = [
        calls(call("r1", "read_file", path="README.md"), call("r2", "list_dir")),
        "The README says hello.",
    ]
    env = environment(script)
    outcome = await env.run("please help", config=settings(workspace, "plan"))
    assert outcome.kinds()[2:] == [
        "MODEL_CALL",
        "OUTPUT",
        "TOOL_RESULT",
        "TOOL_RESULT",
        "MODEL_CALL",
        "OUTPUT",
        "END",
    ]
    read, listing = [e.result for e in of_kind(outcome, K.EVENT_TOOL_RESULT)]
    assert output_of(read) == {"path": "README.md", "content": "hello\n", "truncated": False}
    assert output_of(listing)["entries"] == ["README.md"]
    final = env.requests[1]
    assert [m.role for m in final.messages] == ["system", "user", "assistant", "tool", "tool"]
    assert final.messages[3].tool_results[0].output == output_of(read)


async def test_ask_before_parks_write_file_with_a_deterministic_gated_call(workspace: Path) -> None:
    env = environment([write("new.txt", "content\n"), "written"])
    outcome = await env.run("please help", config=settings(workspace, "ask-before"))
    assert outcome.state == "PARKED"
    (event,) = of_kind(outcome, K.EVENT_TOOL_CALL)
    gated = convert.tool_call_from_proto(event.tool)
    assert gated.mediation == Mediation.REQUIRES_APPROVAL
    assert gated.id == "m-1", "the model's own id is the journaled one"
    assert gated.idempotency_key == idempotency_key(outcome.execution_id, "m-1")
    assert gated.args == {"path": "new.txt", "content": "content\n", "workspace": str(workspace)}
    assert not (workspace / "new.txt").exists()
    assert outcome.kinds()[-1] == "APPROVAL_REQUEST"
    assert env.approval_reason() == "write_file needs approval in ask-before mode"


async def test_ask_before_recovery_reissues_the_same_call_and_the_host_performs_it(workspace: Path) -> None:
    env = environment([write("new.txt", "content\n"), "written"])
    parked = await env.run("please help", config=settings(workspace, "ask-before"))
    env.approve("looks right")
    resumed = await env.resume()
    assert resumed.state == "COMPLETED"
    assert (workspace / "new.txt").read_text(encoding="utf-8") == "content\n"
    receipt = next(e.result for e in of_kind(resumed, K.EVENT_TOOL_RESULT))
    assert not receipt.is_error and output_of(receipt)["created"] is True
    assert receipt.approval_request_seq == len(parked.events)
    final = env.requests[-1]
    assert final.messages[-1].tool_results[0].id == "m-1"
    assert resumed.outputs[-1] == "written"
    # The recovery re-issued the recorded model request and gated call exactly (or it would have
    # diverged); a replay does it once more with the model and the tool untouched.
    report = await env.replay()
    assert (report.executions, report.model_calls, len(env.tool_runs)) == (1, 0, 1)


async def test_a_denied_call_reaches_the_model_as_an_error_and_nothing_is_written(workspace: Path) -> None:
    env = environment([write("new.txt", "x"), "ok, I will not"])
    await env.run("please help", config=settings(workspace, "ask-before"))
    env.deny("not now")
    await env.resume()
    assert not (workspace / "new.txt").exists()
    (answer,) = env.requests[-1].messages[-1].tool_results
    assert answer.is_error and answer.error == "Tool execution denied by approval decision."
    assert answer.decision is None, "the decision stays transport-only"


async def test_auto_writes_in_the_workspace_and_reports(workspace: Path) -> None:
    script: list[Reply] = [
        write("src/app.py", "print('hi')\n"),
        calls(call("s1", "run_shell", command="cat src/app.py; echo done >&2")),
        "done",
    ]
    env = environment(script)
    outcome = await env.run("please help", config=settings(workspace, "auto"))
    assert (workspace / "src" / "app.py").read_text(encoding="utf-8") == "print('hi')\n"
    assert "TOOL_CALL" not in outcome.kinds()
    wrote, ran = [e.result for e in of_kind(outcome, K.EVENT_TOOL_RESULT)]
    assert wrote.id == "m-1"
    assert output_of(wrote) == {"path": "src/app.py", "bytes_written": 12, "created": True}
    assert ran.id == "s1"
    shell = output_of(ran)
    assert (shell["exit_code"], shell["stdout"], shell["stderr"], shell["timed_out"]) == (
        0,
        "print('hi')\n",
        "done\n",
        False,
    )


async def test_allow_edits_edits_in_the_harness_but_gates_the_shell(workspace: Path) -> None:
    script: list[Reply] = [
        calls(call("e1", "edit_file", path="README.md", old_string="hello", new_string="bye")),
        calls(call("s1", "run_shell", command="rm README.md", timeout_s=5)),
    ]
    env = environment(script)
    outcome = await env.run("please help", config=settings(workspace, "allow-edits", shell_timeout_s=10))
    assert outcome.state == "PARKED"
    assert (workspace / "README.md").read_text(encoding="utf-8") == "bye\n"
    (edit,) = [e.result for e in of_kind(outcome, K.EVENT_TOOL_RESULT)]
    assert output_of(edit) == {"path": "README.md", "replacements": 1}
    (event,) = of_kind(outcome, K.EVENT_TOOL_CALL)
    gated = convert.tool_call_from_proto(event.tool)
    assert (gated.name, gated.id) == ("run_shell", "s1")
    assert gated.args == {"command": "rm README.md", "timeout_s": 5, "workspace": str(workspace)}
    assert (workspace / "README.md").exists()


async def test_recovery_does_not_repeat_an_in_harness_edit(workspace: Path) -> None:
    """allow-edits runs edits in the harness; once reported, a recovery serves the recorded
    result instead of editing again (the edit's old text is gone: a re-run would fail)."""
    script: list[Reply] = [
        calls(call("e1", "edit_file", path="README.md", old_string="hello", new_string="hello again")),
        "edited",
    ]
    env = environment(script)
    crashed = await env.run("please help", config=settings(workspace, "allow-edits"), crash_after=2)
    assert crashed.state == "CRASHED" and crashed.kinds()[-1] == "TOOL_RESULT"
    resumed = await env.resume()
    assert resumed.state == "COMPLETED" and resumed.outputs[-1] == "edited"
    assert (workspace / "README.md").read_text(encoding="utf-8") == "hello again\n"
    assert len(of_kind(resumed, K.EVENT_TOOL_RESULT)) == 1, "the report was not written twice"
    report = await env.replay()
    assert report.recorded_results_served == 1
    assert (workspace / "README.md").read_text(encoding="utf-8") == "hello again\n"


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        ("read_file", {"path": "../outside/secret.txt"}),
        ("write_file", {"path": "../outside/planted.txt", "content": "x"}),
        ("write_file", {"path": "{outside}/planted.txt", "content": "x"}),
        ("write_file", {"path": "link/planted.txt", "content": "x"}),
        ("list_dir", {"path": "link"}),
        ("edit_file", {"path": "link/secret.txt", "old_string": "s", "new_string": "t"}),
    ],
)
async def test_paths_leading_out_of_the_workspace_are_refused(
    workspace: Path, tool: str, args: dict[str, str]
) -> None:
    outside = workspace.parent / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret", encoding="utf-8")
    (workspace / "link").symlink_to(outside, target_is_directory=True)
    args = {key: value.replace("{outside}", str(outside)) for key, value in args.items()}
    env = environment([calls(call("x1", tool, **args)), "refused"])
    outcome = await env.run("please help", config=settings(workspace, "auto"))
    (result,) = [e.result for e in of_kind(outcome, K.EVENT_TOOL_RESULT)]
    assert result.is_error
    assert "escapes the workspace" in result.error
    assert not (outside / "planted.txt").exists()
    assert (outside / "secret.txt").read_text(encoding="utf-8") == "secret"


async def test_a_shell_command_past_its_timeout_is_killed(workspace: Path) -> None:
    env = environment(
        [calls(call("s1", "run_shell", command="echo started; sleep 60; echo late")), "gave up"]
    )
    outcome = await env.run("please help", config=settings(workspace, "auto", shell_timeout_s=0.5))
    (result,) = [e.result for e in of_kind(outcome, K.EVENT_TOOL_RESULT)]
    shell = output_of(result)
    assert shell["timed_out"] is True
    assert shell["exit_code"] is None
    assert "late" not in shell["stdout"]


async def test_shell_output_is_capped(tmp_path: Path) -> None:
    workspace = Workspace.open(tmp_path)
    result = await workspace.run_shell("head -c 200000 /dev/zero | tr '\\0' a", timeout_s=30)
    assert result["truncated"] is True
    assert result["stdout"] == "a" * SHELL_OUTPUT_LIMIT_BYTES
    assert result["exit_code"] == 0


async def test_edit_file_needs_exactly_one_occurrence(tmp_path: Path) -> None:
    workspace = Workspace.open(tmp_path)
    (tmp_path / "f.txt").write_text("a a b", encoding="utf-8")
    with pytest.raises(coding_tools.CodingToolError, match="occurs 2 times"):
        workspace.edit_file("f.txt", "a", "c")
    with pytest.raises(coding_tools.CodingToolError, match="does not occur"):
        workspace.edit_file("f.txt", "z", "c")
    assert workspace.edit_file("f.txt", "b", "c") == {"path": "f.txt", "replacements": 1}
    assert (tmp_path / "f.txt").read_text(encoding="utf-8") == "a a c"


async def test_the_loop_is_bounded_by_max_steps(workspace: Path) -> None:
    looping = calls(call("", "list_dir", path="."))
    env = environment([looping, looping, looping])
    outcome = await env.run("please help", config=settings(workspace, "plan", max_steps=2))
    assert len(env.requests) == 2
    assert outcome.outputs[-1] == "Stopped after 2 model steps without a final answer."
    # Ids the model left empty are filled deterministically so results still correlate.
    second = env.requests[1]
    filled = completion_call_id(outcome.execution_id, 0, 0)
    assert second.messages[-2].tool_calls[0].id == filled
    assert second.messages[-1].tool_results[0].id == filled


async def test_reruns_of_an_execution_are_byte_identical(workspace: Path) -> None:
    script: list[Reply] = [calls(call("r1", "read_file", path="README.md")), "fine"]
    journals = []
    for _ in range(2):
        env = environment(script)
        await env.run("please help", config=settings(workspace, "ask-before"))
        journals.append([e.SerializeToString(deterministic=True) for e in env.events])
    assert journals[0] == journals[1]
    report = await check_replay(
        CodingHarness(), "please help", model=script, config=settings(workspace, "ask-before")
    )
    assert report.recorded_results_served == 1 and report.model_calls == 0


async def test_history_contributes_the_whole_conversation(workspace: Path) -> None:
    script: list[Reply] = [
        calls(call("old", "read_file", path="README.md"), text="looking"),
        "answer one",
        "ok",
    ]
    env = environment(script)
    await env.run("first", config=settings(workspace, "plan", system_prompt="be brief"))
    await env.run("second", config=settings(workspace, "plan", system_prompt="be brief"))
    messages = env.requests[-1].messages
    assert [(m.role, m.text()) for m in messages] == [
        ("system", "be brief"),
        ("user", "first"),
        ("assistant", "looking"),
        ("tool", ""),
        ("assistant", "answer one"),
        ("user", "second"),
    ]
    assert messages[2].tool_calls[0].id == "old" and messages[3].tool_results[0].id == "old"
    last = [e.execution_id for e in env.events if e.kind == K.EVENT_EXECUTION_START][-1]
    assert conversation(env.start_of(last), "be brief") == list(messages)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (b"not json", "coding config is not JSON"),
        (b"[]", "must be a JSON object"),
        (json.dumps({"workspace": "/tmp", "mode": "yolo"}).encode(), "mode: 'yolo' is not one of"),
        (json.dumps({"workspce": "/tmp"}).encode(), "unknown key(s) 'workspce'"),
        (json.dumps({"mode": "auto"}).encode(), "workspace: required"),
        (json.dumps({"workspace": "relative/dir"}).encode(), "must be an absolute path"),
        (json.dumps({"workspace": "/nonexistent/agentsessions-ws"}).encode(), "not an existing directory"),
        (json.dumps({"workspace": "/tmp", "max_steps": 0}).encode(), "max_steps: must be an integer"),
        (json.dumps({"workspace": "/tmp", "shell_timeout_s": 1e9}).encode(), "shell_timeout_s: must be in"),
        (json.dumps({"workspace": 7}).encode(), "workspace: must be a string"),
    ],
)
async def test_bad_config_fails_before_any_model_call(config: bytes, message: str) -> None:
    env = environment(["never"])
    outcome = await env.run(config=config)
    assert outcome.state == "FAILED" and isinstance(outcome.error, CodingConfigError)
    assert message in str(outcome.error)
    assert env.model_calls == 0 and "MODEL_CALL" not in outcome.kinds()


async def test_constructor_defaults_apply_when_config_is_empty(workspace: Path) -> None:
    env = HarnessEnvironment(CodingHarness(workspace=str(workspace), mode="auto", model="m"), model=["fine"])
    await env.run("go")
    (request,) = env.requests
    assert request.model == "m"
    assert offered(request) == ["read_file", "list_dir", "write_file", "edit_file", "run_shell"]


async def test_host_entry_points_honour_the_workspace_allow_list(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = {"workspace": str(workspace), "path": "n.txt", "content": "x"}
    monkeypatch.setenv(coding_tools.WORKSPACES_ENV, os.pathsep.join([str(tmp_path / "elsewhere")]))
    with pytest.raises(coding_tools.WorkspaceEscapeError, match="outside AGENTSESSIONS_CODING_WORKSPACES"):
        await coding_tools.write_file(dict(args), None)
    monkeypatch.setenv(coding_tools.WORKSPACES_ENV, str(tmp_path))
    assert (await coding_tools.write_file(dict(args), None))["created"] is True
    assert (workspace / "n.txt").read_text(encoding="utf-8") == "x"
    with pytest.raises(coding_tools.CodingToolError, match="'workspace' is required"):
        await coding_tools.read_file({"path": "n.txt"}, None)
