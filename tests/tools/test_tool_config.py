"""Tool-executor configuration: flag syntax, JSON/TOML files, and building executors from them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentsessions.host.tools import (
    McpExecutor,
    McpServerConfig,
    PythonCallableExecutor,
    PythonToolConfig,
    ToolConfigError,
    ToolContext,
    load_tools_file,
    parse_mcp_server_flag,
    parse_tool_executor_flag,
    tools_config_from_flags,
)
from agentsessions.v1 import common_pb2


def greet(args: dict[str, Any], context: ToolContext) -> str:
    """Say hello."""
    return f"hello {args.get('name', 'world')}"


def test_tool_executor_flag() -> None:
    assert parse_tool_executor_flag("python:pkg.mod:func") == PythonToolConfig(target="pkg.mod:func")
    assert parse_tool_executor_flag("python:pkg.mod:func=write-file_2") == PythonToolConfig(
        target="pkg.mod:func", name="write-file_2"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("pkg.mod:func", "expected 'python:package.module:function"),
        ("mcp:pkg.mod:func", "expected 'python:package.module:function"),
        ("python:pkg.mod", "expected 'python:package.module:function"),
        ("python::func", "expected 'python:package.module:function"),
        ("python:pkg.mod:func=", "name '' must match"),
        ("python:pkg.mod:func=has space", "name 'has space' must match"),
        ("python:pkg.mod:func=" + "x" * 65, "must match"),
    ],
)
def test_tool_executor_flag_errors(value: str, message: str) -> None:
    with pytest.raises(ToolConfigError, match=r"^--tool-executor") as caught:
        parse_tool_executor_flag(value)
    assert message in str(caught.value)


def test_mcp_server_flag_splits_like_a_shell() -> None:
    config = parse_mcp_server_flag("files=npx -y '@scope/server files' --root \"/srv/a b\"")
    assert config == McpServerConfig(
        name="files", command="npx", args=("-y", "@scope/server files", "--root", "/srv/a b")
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("just-a-command", "expected name='command arg ...'"),
        ("=cmd", "name '' must match"),
        ("files=", "command is empty"),
        ("files='unterminated", "command line does not parse"),
    ],
)
def test_mcp_server_flag_errors(value: str, message: str) -> None:
    with pytest.raises(ToolConfigError, match=r"^--mcp-server") as caught:
        parse_mcp_server_flag(value)
    assert message in str(caught.value)


TOML = """
[[python]]
target = "pkg.mod:func"
name = "renamed"
description = "does things"
input_schema = { type = "object", properties = { path = { type = "string" } } }

[[mcp]]
name = "files"
command = "npx"
args = ["-y", "server"]
env = { LOG_LEVEL = "warn" }
cwd = "/tmp"
start_timeout_s = 5
call_timeout_s = 7.5
"""


def test_toml_and_json_files_say_the_same_thing(tmp_path: Path) -> None:
    toml_file = tmp_path / "tools.toml"
    toml_file.write_text(TOML, encoding="utf-8")
    from_toml = load_tools_file(toml_file)
    assert from_toml.python == (
        PythonToolConfig(
            target="pkg.mod:func",
            name="renamed",
            description="does things",
            input_schema={"type": "object", "properties": {"path": {"type": "string"}}},
        ),
    )
    assert from_toml.mcp == (
        McpServerConfig(
            name="files",
            command="npx",
            args=("-y", "server"),
            env={"LOG_LEVEL": "warn"},
            cwd="/tmp",
            start_timeout_s=5.0,
            call_timeout_s=7.5,
        ),
    )
    json_file = tmp_path / "tools.json"
    json_file.write_text(
        json.dumps(
            {
                "python": [
                    {
                        "target": "pkg.mod:func",
                        "name": "renamed",
                        "description": "does things",
                        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
                    }
                ],
                "mcp": [
                    {
                        "name": "files",
                        "command": "npx",
                        "args": ["-y", "server"],
                        "env": {"LOG_LEVEL": "warn"},
                        "cwd": "/tmp",
                        "start_timeout_s": 5,
                        "call_timeout_s": 7.5,
                    }
                ],
            }
        ),
        encoding="utf-8",
    )
    assert load_tools_file(json_file) == from_toml


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"pythn": []}, "tools.json: unknown key(s) 'pythn'"),
        ({"python": {}}, "tools.json.python: expected a list of tables"),
        ({"python": [{"name": "x"}]}, "tools.json.python[0].target: required string"),
        ({"python": [{"target": "a:b", "nmae": "x"}]}, "tools.json.python[0]: unknown key(s) 'nmae'"),
        ({"python": [{"target": "a:b", "input_schema": []}]}, "python[0].input_schema: expected a table"),
        ({"mcp": [{"name": "f"}]}, "tools.json.mcp[0].command: required string"),
        ({"mcp": [{"name": "f", "command": ""}]}, "mcp[0].command: expected a non-empty string"),
        ({"mcp": [{"name": "f", "command": "c", "args": "a b"}]}, "mcp[0].args: expected a list of strings"),
        (
            {"mcp": [{"name": "f", "command": "c", "env": {"A": 1}}]},
            "mcp[0].env: expected a table of strings",
        ),
        ({"mcp": [{"name": "f", "command": "c", "call_timeout_s": 0}]}, "must be a positive number"),
        ({"mcp": [{"name": "f", "command": "c", "call_timeout_s": True}]}, "expected a number of seconds"),
        ({"mcp": [{"name": "bad name", "command": "c"}]}, "mcp[0]: name 'bad name' must match"),
        ([], "tools.json: expected a table/object"),
    ],
)
def test_file_errors_name_the_path(tmp_path: Path, document: object, message: str) -> None:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(ToolConfigError) as caught:
        load_tools_file(path)
    assert message in str(caught.value)


def test_unreadable_and_unparsable_files(tmp_path: Path) -> None:
    with pytest.raises(ToolConfigError, match="cannot read"):
        load_tools_file(tmp_path / "missing.json")
    broken = tmp_path / "broken.toml"
    broken.write_text("[[python]\n", encoding="utf-8")
    with pytest.raises(ToolConfigError, match="does not parse"):
        load_tools_file(broken)


def test_flags_and_files_merge_files_first(tmp_path: Path) -> None:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps({"python": [{"target": "from.file:f"}]}), encoding="utf-8")
    config = tools_config_from_flags(
        tool_executors=["python:from.flag:g=g"], mcp_servers=["m=server --x"], files=[path]
    )
    assert [tool.target for tool in config.python] == ["from.file:f", "from.flag:g"]
    assert [server.name for server in config.mcp] == ["m"]


async def test_built_executors_run(tmp_path: Path) -> None:
    config = tools_config_from_flags(
        tool_executors=[f"python:{__name__}:greet=say_hello"], mcp_servers=["m=never-started"]
    )
    executors = config.build_executors()
    assert isinstance(executors[0], PythonCallableExecutor)
    assert isinstance(executors[1], McpExecutor)
    assert [(s.name, s.description) for s in executors[0].tools()] == [("say_hello", "Say hello.")]

    class Receipts:
        async def get_tool_receipt(self, uid: str, key: str) -> common_pb2.ToolResult | None:
            return None

        async def put_tool_receipt(self, uid: str, key: str, result: common_pb2.ToolResult) -> None:
            return None

    registry = tools_config_from_flags(tool_executors=[f"python:{__name__}:greet"]).build_registry(Receipts())
    call = common_pb2.ToolCall(
        id="c", tool="greet", mediation=common_pb2.MEDIATION_CONTROLLER_MEDIATED, idempotency_key="k"
    )
    call.args.update({"name": "ada"})
    result = await registry.execute("sess-x", call)
    assert [part.text.text for part in result.content] == ["hello ada"]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
        (f"{__name__}:missing", "has no 'missing'"),
        (f"{__name__}:TOML", "is not callable"),
    ],
)
def test_bad_import_targets_fail_at_build(target: str, message: str) -> None:
    with pytest.raises(ToolConfigError, match=message):
        PythonToolConfig(target=target).build()
