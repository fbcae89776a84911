"""The coding harness driven in-process by a journal-recording sink and the scripted model.

The sink plays the host: it journals each effect, calls the ScriptedModel for model calls,
parks REQUIRES_APPROVAL calls until a decision is configured, and runs approved calls through
the host's real ToolRegistry over the coding_tools executor functions.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from agentsessions.harnesses import coding_tools
from agentsessions.harnesses.coding import (
    CodingConfigError,
    CodingHarness,
    conversation,
    idempotency_key,
    model_call_id,
    tool_call_id,
)
from agentsessions.harnesses.coding_tools import SHELL_OUTPUT_LIMIT_BYTES, Workspace
from agentsessions.host.models.scripted import (
    Completion,
    ScriptedModel,
    assistant_text,
    assistant_tool_calls,
    tool_call_part,
)
from agentsessions.host.tools import PythonCallableExecutor, ToolRegistry
from agentsessions.sdk.errors import ApprovalParkedError
from agentsessions.sdk.harness import Start, message_text, text_message
from agentsessions.v1 import common_pb2, harness_pb2

EXECUTION = "0123456789abcdef"
SESSION = "sess-00000000000000000000c0de"
APPROVAL = common_pb2.MEDIATION_REQUIRES_APPROVAL
REPORTED = common_pb2.MEDIATION_IN_HARNESS_REPORTED


class DictReceipts:
    def __init__(self) -> None:
        self.receipts: dict[tuple[str, str], bytes] = {}

    async def get_tool_receipt(self, uid: str, key: str) -> common_pb2.ToolResult | None:
        raw = self.receipts.get((uid, key))
        return None if raw is None else common_pb2.ToolResult.FromString(raw)

    async def put_tool_receipt(self, uid: str, key: str, result: common_pb2.ToolResult) -> None:
        self.receipts.setdefault((uid, key), result.SerializeToString())


def host_registry() -> ToolRegistry:
    executors = [
        PythonCallableExecutor.from_import_path(f"agentsessions.harnesses.coding_tools:{name}")
        for name in ("write_file", "edit_file", "run_shell")
    ]
    return ToolRegistry(DictReceipts(), executors)


class JournalSink:
    """An EventSink recording journal-like entries: (kind, message) in order.

    ``decision`` None parks every approval-gated call; True/False approves or denies it.
    """

    def __init__(self, script: Sequence[Completion], *, decision: bool | None = None) -> None:
        self.model_provider = ScriptedModel(script)
        self.decision = decision
        self.registry = host_registry()
        self.journal: list[tuple[str, Any]] = []

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.journal]

    def entries(self, kind: str) -> list[Any]:
        return [body for k, body in self.journal if k == kind]

    async def model(self, call: common_pb2.ModelCall) -> harness_pb2.ModelResult:
        self.journal.append(("MODEL_CALL", call))
        result = await self.model_provider.complete(call)
        self.journal.append(("OUTPUT", result.message))
        return result

    async def output(self, text: str) -> None:
        self.journal.append(("OUTPUT", text_message("assistant", text)))

    async def tool_call(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        assert call.mediation == APPROVAL, "the coding harness routes only gated calls to the host"
        self.journal.append(("TOOL_CALL", call))
        self.journal.append(("APPROVAL_REQUEST", call.id))
        if self.decision is None:
            raise ApprovalParkedError(
                common_pb2.ApprovalRef(
                    execution_id=EXECUTION, tool_call_id=call.id, request_seq=len(self.journal)
                )
            )
        if self.decision:
            result = await self.registry.execute(SESSION, call)
        else:
            denied = "Tool execution denied by approval decision."
            result = common_pb2.ToolResult(
                id=call.id,
                is_error=True,
                code=common_pb2.ToolResult.APPROVAL_DENIED,
                error=denied,
                content=[common_pb2.Part(text=common_pb2.TextPart(text=denied))],
            )
        self.journal.append(("TOOL_RESULT", result))
        return result

    async def report(self, result: common_pb2.ToolResult) -> None:
        self.journal.append(("TOOL_RESULT", result))

    async def usage(self, usage: common_pb2.Usage) -> None:
        self.journal.append(("USAGE", usage))


def start(workspace: Path, mode: str, *inputs: str, **config: Any) -> Start:
    document = {"workspace": str(workspace), "mode": mode, **config}
    return Start(
        session=SESSION,
        execution_id=EXECUTION,
        inputs=[text_message("user", text) for text in inputs or ("please help",)],
        config=json.dumps(document).encode(),
    )


def offered(call: common_pb2.ModelCall) -> list[str]:
    return [tool.name for tool in call.tools]


def output_of(result: common_pb2.ToolResult) -> dict[str, Any]:
    return json_format.MessageToDict(result.output)


def write(path: str, content: str, call_id: str = "m-1") -> common_pb2.Message:
    return assistant_tool_calls(tool_call_part(call_id, "write_file", {"path": path, "content": content}))


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "README.md").write_text("hello\n", encoding="utf-8")
    return root


async def test_describe() -> None:
    descriptor = await CodingHarness().describe()
    assert (descriptor.id, descriptor.version) == ("coding", "1")
    assert descriptor.capabilities.resumability == harness_pb2.RESUMABILITY_STATELESS_REPLAY
    assert {tool.name: tool.mediation for tool in descriptor.tools} == {
        "read_file": REPORTED,
        "list_dir": REPORTED,
        "write_file": APPROVAL,
        "edit_file": APPROVAL,
        "run_shell": APPROVAL,
    }


async def test_plan_mode_offers_no_write_tools_and_refuses_them(workspace: Path) -> None:
    sink = JournalSink([write("new.txt", "x"), "I only looked."])
    await CodingHarness().run(start(workspace, "plan"), sink)
    first, second = sink.entries("MODEL_CALL")
    assert offered(first) == ["read_file", "list_dir"]
    (refusal,) = sink.entries("TOOL_RESULT")
    assert refusal.is_error
    assert refusal.id == tool_call_id(EXECUTION, 0, 0)
    assert "not available in plan mode" in refusal.error
    assert not (workspace / "new.txt").exists()
    assert "TOOL_CALL" not in sink.kinds()
    # The model saw the refusal, correlated to its own call id.
    tool_message = second.messages[-1]
    assert tool_message.role == "tool"
    assert tool_message.parts[0].tool_result.id == "m-1"
    assert tool_message.parts[0].tool_result.is_error


async def test_reads_run_in_the_harness_and_are_reported_before_the_model_sees_them(workspace: Path) -> None:
    script: list[Completion] = [
        assistant_tool_calls(
            tool_call_part("r1", "read_file", {"path": "README.md"}), tool_call_part("r2", "list_dir", {})
        ),
        "The README says hello.",
    ]
    sink = JournalSink(script)
    await CodingHarness().run(start(workspace, "plan"), sink)
    assert sink.kinds() == ["MODEL_CALL", "OUTPUT", "TOOL_RESULT", "TOOL_RESULT", "MODEL_CALL", "OUTPUT"]
    read, listing = sink.entries("TOOL_RESULT")
    assert output_of(read) == {"path": "README.md", "content": "hello\n", "truncated": False}
    assert output_of(listing)["entries"] == ["README.md"]
    final_call = sink.entries("MODEL_CALL")[1]
    assert [m.role for m in final_call.messages] == ["system", "user", "assistant", "tool", "tool"]
    assert final_call.messages[3].parts[0].tool_result.output == read.output


async def test_ask_before_parks_write_file_with_a_deterministic_gated_call(workspace: Path) -> None:
    sink = JournalSink([write("new.txt", "content\n"), "written"])
    with pytest.raises(ApprovalParkedError):
        await CodingHarness().run(start(workspace, "ask-before"), sink)
    (call,) = sink.entries("TOOL_CALL")
    assert call.mediation == APPROVAL
    assert call.id == tool_call_id(EXECUTION, 0, 0) == f"call-{EXECUTION}-0-0"
    assert call.idempotency_key == idempotency_key(EXECUTION, 0, 0) == f"coding-{EXECUTION}-0-0"
    assert dict(call.args) == {"path": "new.txt", "content": "content\n", "workspace": str(workspace)}
    assert not (workspace / "new.txt").exists()
    assert sink.kinds()[-1] == "APPROVAL_REQUEST"


async def test_ask_before_recovery_reissues_the_same_call_and_the_host_performs_it(workspace: Path) -> None:
    script: list[Completion] = [write("new.txt", "content\n"), "written"]
    parked = JournalSink(script)
    with pytest.raises(ApprovalParkedError):
        await CodingHarness().run(start(workspace, "ask-before"), parked)
    approved = JournalSink(script, decision=True)
    await CodingHarness().run(start(workspace, "ask-before"), approved)
    # Replay reproduces the model request and the gated call byte for byte.
    assert (
        parked.entries("MODEL_CALL")[0].SerializeToString()
        == approved.entries("MODEL_CALL")[0].SerializeToString()
    )
    assert (
        parked.entries("TOOL_CALL")[0].SerializeToString()
        == approved.entries("TOOL_CALL")[0].SerializeToString()
    )
    assert (workspace / "new.txt").read_text(encoding="utf-8") == "content\n"
    (receipt,) = approved.entries("TOOL_RESULT")
    assert not receipt.is_error
    assert output_of(receipt)["created"] is True
    final = approved.entries("MODEL_CALL")[1]
    assert final.messages[-1].parts[0].tool_result.id == "m-1"
    assert message_text(approved.entries("OUTPUT")[-1]) == "written"


async def test_a_denied_call_reaches_the_model_as_an_error_and_nothing_is_written(workspace: Path) -> None:
    sink = JournalSink([write("new.txt", "x"), "ok, I will not"], decision=False)
    await CodingHarness().run(start(workspace, "ask-before"), sink)
    assert not (workspace / "new.txt").exists()
    answer = sink.entries("MODEL_CALL")[1].messages[-1].parts[0].tool_result
    assert answer.is_error
    assert answer.error == "Tool execution denied by approval decision."


async def test_auto_writes_in_the_workspace_and_reports(workspace: Path) -> None:
    script: list[Completion] = [
        write("src/app.py", "print('hi')\n"),
        assistant_tool_calls(tool_call_part("s1", "run_shell", {"command": "cat src/app.py; echo done >&2"})),
        "done",
    ]
    sink = JournalSink(script)
    await CodingHarness().run(start(workspace, "auto"), sink)
    assert (workspace / "src" / "app.py").read_text(encoding="utf-8") == "print('hi')\n"
    assert "TOOL_CALL" not in sink.kinds()
    wrote, ran = sink.entries("TOOL_RESULT")
    assert wrote.id == tool_call_id(EXECUTION, 0, 0)
    assert output_of(wrote) == {"path": "src/app.py", "bytes_written": 12.0, "created": True}
    assert ran.id == tool_call_id(EXECUTION, 1, 0)
    shell = output_of(ran)
    assert (shell["exit_code"], shell["stdout"], shell["stderr"], shell["timed_out"]) == (
        0.0,
        "print('hi')\n",
        "done\n",
        False,
    )


async def test_allow_edits_edits_in_the_harness_but_gates_the_shell(workspace: Path) -> None:
    script: list[Completion] = [
        assistant_tool_calls(
            tool_call_part(
                "e1", "edit_file", {"path": "README.md", "old_string": "hello", "new_string": "bye"}
            )
        ),
        assistant_tool_calls(tool_call_part("s1", "run_shell", {"command": "rm README.md", "timeout_s": 5})),
    ]
    sink = JournalSink(script)
    with pytest.raises(ApprovalParkedError):
        await CodingHarness().run(start(workspace, "allow-edits", shell_timeout_s=10), sink)
    assert (workspace / "README.md").read_text(encoding="utf-8") == "bye\n"
    (edit,) = sink.entries("TOOL_RESULT")
    assert output_of(edit) == {"path": "README.md", "replacements": 1.0}
    (gated,) = sink.entries("TOOL_CALL")
    assert gated.tool == "run_shell"
    assert gated.id == tool_call_id(EXECUTION, 1, 0)
    assert dict(gated.args) == {"command": "rm README.md", "timeout_s": 5.0, "workspace": str(workspace)}
    assert (workspace / "README.md").exists()


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
    sink = JournalSink([assistant_tool_calls(tool_call_part("x1", tool, args)), "refused"])
    await CodingHarness().run(start(workspace, "auto"), sink)
    (result,) = sink.entries("TOOL_RESULT")
    assert result.is_error
    assert "escapes the workspace" in result.error
    assert not (outside / "planted.txt").exists()
    assert (outside / "secret.txt").read_text(encoding="utf-8") == "secret"


async def test_a_shell_command_past_its_timeout_is_killed(workspace: Path) -> None:
    script: list[Completion] = [
        assistant_tool_calls(
            tool_call_part("s1", "run_shell", {"command": "echo started; sleep 60; echo late"})
        ),
        "gave up",
    ]
    sink = JournalSink(script)
    await CodingHarness().run(start(workspace, "auto", shell_timeout_s=0.5), sink)
    (result,) = sink.entries("TOOL_RESULT")
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
    looping = assistant_tool_calls(tool_call_part("", "list_dir", {"path": "."}))
    sink = JournalSink([looping, looping, looping])
    await CodingHarness().run(start(workspace, "plan", max_steps=2), sink)
    assert len(sink.entries("MODEL_CALL")) == 2
    assert message_text(sink.entries("OUTPUT")[-1]) == "Stopped after 2 model steps without a final answer."
    # Ids the model left empty are filled deterministically so results still correlate.
    second = sink.entries("MODEL_CALL")[1]
    assert second.messages[-2].parts[0].tool_call.id == tool_call_id(EXECUTION, 0, 0)
    assert second.messages[-1].parts[0].tool_result.id == tool_call_id(EXECUTION, 0, 0)


async def test_reruns_of_an_execution_are_byte_identical(workspace: Path) -> None:
    script: list[Completion] = [
        assistant_tool_calls(tool_call_part("r1", "read_file", {"path": "README.md"})),
        "fine",
    ]
    runs = []
    sinks = []
    for _ in range(2):
        sink = JournalSink(script)
        await CodingHarness().run(start(workspace, "ask-before"), sink)
        sinks.append(sink)
        runs.append([(kind, body.SerializeToString()) for kind, body in sink.journal])
    assert runs[0] == runs[1]
    model_ids = [call.id for call in sinks[1].entries("MODEL_CALL")]
    assert model_ids == [model_call_id(EXECUTION, 0), model_call_id(EXECUTION, 1)]
    assert len(set(model_ids)) == 2 and all(len(i) == 16 for i in model_ids)


async def test_history_contributes_inputs_and_output_text_only(workspace: Path) -> None:
    earlier_output = assistant_tool_calls(tool_call_part("old", "read_file", {"path": "x"}), text="looked")
    history = [
        common_pb2.Event(kind=common_pb2.EVENT_EXECUTION_START),
        common_pb2.Event(kind=common_pb2.EVENT_INPUT, message=text_message("user", "first")),
        common_pb2.Event(kind=common_pb2.EVENT_OUTPUT, message=earlier_output),
        common_pb2.Event(
            kind=common_pb2.EVENT_OUTPUT, message=assistant_tool_calls(tool_call_part("c", "list_dir", {}))
        ),
        common_pb2.Event(kind=common_pb2.EVENT_TOOL_RESULT, result=common_pb2.ToolResult(id="old")),
        common_pb2.Event(kind=common_pb2.EVENT_OUTPUT, message=assistant_text("answer one")),
    ]
    begin = Start(
        session=SESSION,
        execution_id=EXECUTION,
        inputs=[text_message("user", "second")],
        history=history,
        config=json.dumps({"workspace": str(workspace), "system_prompt": "be brief"}).encode(),
    )
    messages = conversation(begin, "be brief")
    assert [(m.role, message_text(m)) for m in messages] == [
        ("system", "be brief"),
        ("user", "first"),
        ("assistant", "looked"),
        ("assistant", "answer one"),
        ("user", "second"),
    ]
    assert all(p.WhichOneof("part") == "text" for m in messages for p in m.parts)
    sink = JournalSink(["ok"])
    await CodingHarness().run(begin, sink)
    assert list(sink.entries("MODEL_CALL")[0].messages) == messages


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
    sink = JournalSink(["never"])
    with pytest.raises(CodingConfigError) as caught:
        await CodingHarness().run(Start(session=SESSION, execution_id=EXECUTION, config=config), sink)
    assert message in str(caught.value)
    assert sink.journal == []


async def test_constructor_defaults_apply_when_config_is_empty(workspace: Path) -> None:
    sink = JournalSink(["fine"])
    harness = CodingHarness(workspace=str(workspace), mode="auto", model="m")
    await harness.run(
        Start(session=SESSION, execution_id=EXECUTION, inputs=[text_message("user", "go")]), sink
    )
    (call,) = sink.entries("MODEL_CALL")
    assert call.model == "m"
    assert offered(call) == ["read_file", "list_dir", "write_file", "edit_file", "run_shell"]


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
