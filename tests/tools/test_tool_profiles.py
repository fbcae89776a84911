"""What the tools configuration says about a tool besides how to run it: classes, workspaces,
subprocess tools and confinement; and what the registry reports for each served tool."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from agentsessions.host.journal.store import JournalStore
from agentsessions.host.tools import (
    SubprocessTool,
    ToolConfigError,
    ToolProfile,
    WorkspaceRule,
    tools_config_from_mapping,
)

SERVER = Path(__file__).with_name("mcp_tool_server.py")


def test_classes_and_workspaces_of_python_and_mcp_tools() -> None:
    config = tools_config_from_mapping(
        {
            "python": [
                {
                    "target": "pkg.mod:func",
                    "class": ["write", "network"],
                    "workspace_arg": "workspace",
                    "workspace_roots": ["/srv/repos"],
                },
                {"target": "pkg.mod:other"},
            ],
            "mcp": [
                {"name": "files", "command": "srv", "class": "read-only", "tool_classes": {"put": "write"}}
            ],
        }
    )
    first, second = config.python
    assert first.profile == ToolProfile(
        frozenset({"write", "network"}), WorkspaceRule(argument="workspace", roots=("/srv/repos",))
    )
    assert second.profile == ToolProfile(), "no class: unclassified"
    (server,) = config.mcp
    assert server.classes == {"read-only"} and server.tool_classes == {"put": frozenset({"write"})}


def test_a_subprocess_entry_and_the_confinement_table() -> None:
    config = tools_config_from_mapping(
        {
            "subprocess": [
                {
                    "name": "run_tests",
                    "command": ["python", "-m", "pytest", "{target}"],
                    "workspace": "/srv/repo",
                    "timeout_s": 120,
                    "network": True,
                    "env": {"LANG": "C.UTF-8"},
                }
            ],
            "confinement": {"bwrap": "/opt/bwrap"},
        }
    )
    assert config.subprocess == (
        SubprocessTool(
            name="run_tests",
            command=("python", "-m", "pytest", "{target}"),
            workspace=WorkspaceRule(directory="/srv/repo"),
            timeout_s=120.0,
            network=True,
            env={"LANG": "C.UTF-8"},
        ),
    )
    assert config.bwrap == "/opt/bwrap"
    assert tools_config_from_mapping({"confinement": {"bwrap": ""}}).bwrap == "", '"" turns it off'


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"python": [{"target": "m:f", "class": "writes"}]}, "python[0].class: 'writes' is not a tool class"),
        ({"python": [{"target": "m:f", "class": []}]}, "python[0].class: name at least one tool class"),
        ({"python": [{"target": "m:f", "class": 3}]}, "python[0].class: expected a tool class or a list"),
        ({"mcp": [{"name": "s", "command": "c", "tool_classes": {"t": "x"}}]}, "mcp[0].tool_classes.t: 'x'"),
        (
            {"python": [{"target": "m:f", "workspace_roots": ["/a"]}]},
            "workspace_roots: only with workspace_arg",
        ),
        ({"subprocess": [{"name": "t", "workspace": "/w"}]}, "subprocess[0].command: required"),
        (
            {"subprocess": [{"name": "t", "command": ["x"]}]},
            "subprocess[0]: workspace or workspace_arg is required",
        ),
        (
            {"subprocess": [{"name": "t", "command": ["x"], "workspace_arg": "w"}]},
            "subprocess[0].workspace_roots: required with workspace_arg",
        ),
        (
            {"subprocess": [{"name": "t", "command": ["x"], "workspace": "rel"}]},
            "subprocess[0].workspace: 'rel' is not an absolute path",
        ),
        (
            {"subprocess": [{"name": "t", "command": ["x"], "workspace": "/w", "workspace_arg": "w"}]},
            "set workspace or workspace_arg, not both",
        ),
        (
            {"subprocess": [{"name": "t", "command": ["x"], "workspace": "/w", "shell": True}]},
            "unknown key(s) 'shell'",
        ),
        (
            {"subprocess": [{"name": "t", "command": ["x"], "workspace": "/w", "network": "no"}]},
            "network: expected true or false",
        ),
        ({"confinement": {"bwrap": 1}}, "confinement.bwrap: expected a path"),
        ({"confinement": {"bubblewrap": "x"}}, "confinement: unknown key(s) 'bubblewrap'"),
    ],
)
def test_a_malformed_setting_is_refused_naming_it(document: dict[str, Any], message: str) -> None:
    with pytest.raises(ToolConfigError) as err:
        tools_config_from_mapping(document)
    assert message in str(err.value)


async def test_the_registry_reports_each_served_tools_profile(store: JournalStore, tmp_path: Path) -> None:
    document = {
        "python": [
            {"target": "tests.approvals.mode_harnesses:write_note", "class": "write"},
            {"target": "tests.approvals.mode_harnesses:read_note", "class": "subprocess"},
        ],
        "mcp": [
            {
                "name": "test",
                "command": sys.executable,
                "args": [str(SERVER)],
                "class": "read-only",
                "tool_classes": {"append_marker": "write"},
                "start_timeout_s": 60,
            }
        ],
        "subprocess": [{"name": "run", "command": ["true"], "workspace": str(tmp_path), "network": True}],
        "confinement": {"bwrap": str(tmp_path / "missing-bwrap")},
    }
    registry = tools_config_from_mapping(document).build_registry(store)
    try:
        write = await registry.profile("write_note")
        assert write is not None and write.classes == {"write"}
        read = await registry.profile("read_note")
        assert read is not None and read.confinement is not None and not read.confinement.confined
        assert "inside the host process" in read.confinement.detail, "a Python tool is never confined"
        add, marker = await registry.profile("add"), await registry.profile("append_marker")
        assert add is not None and add.classes == {"read-only"}
        assert marker is not None and marker.classes == {"write"}
        run = await registry.profile("run")
        assert run is not None and run.classes == {"subprocess", "network"}
        assert run.workspace == WorkspaceRule(directory=str(tmp_path))
        assert run.confinement is not None
        assert run.confinement.detail == f"no bubblewrap at {tmp_path / 'missing-bwrap'}"
        assert await registry.profile("nobody_serves_this") is None
    finally:
        await registry.stop()


async def test_a_workspace_rule_resolves_links_before_it_judges(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    (root / "link").symlink_to(elsewhere)
    (root / "inner").mkdir()
    rule = WorkspaceRule(argument="ws", roots=(str(root),))
    assert await rule.outside({"ws": str(root / "inner")}) is None
    assert await rule.outside({"ws": str(root)}) is None
    assert (
        await rule.outside({"ws": str(root / "link")})
        == f"workspace {str(root / 'link')!r} is not under {root}"
    )
    assert await rule.outside({"ws": str(tmp_path / "rootless")}) is not None, "a prefix is not a parent"
    assert await rule.outside({"ws": "relative"}) == "workspace 'relative' is not an absolute path"
    assert await rule.outside({}) == "argument 'ws' names no workspace"
