"""The shared words of modes and tool classes (agentsessions.sdk.modes) and how the host tells a
harness its session's mode (agentsessions-mode in the Connect metadata)."""

from __future__ import annotations

import pytest

from agentsessions.harnesses.coding import CodingHarness
from agentsessions.sdk.extensions import MODE, connect_metadata, parse_connect_metadata
from agentsessions.sdk.modes import check_mode, declared_tool_classes, strictest, with_tool_classes
from agentsessions.sdk.testing import HarnessEnvironment


def test_strictest_ranks_plan_first_and_skips_no_mode() -> None:
    assert strictest("auto", "ask-before", "allow-edits") == "ask-before"
    assert strictest("", "auto") == "auto"
    assert strictest("", "") == ""
    assert check_mode("plan") == "plan"
    with pytest.raises(ValueError, match="'careful' is not a mode"):
        check_mode("careful")


def test_the_tool_class_tag_round_trips_through_a_description() -> None:
    described = with_tool_classes("Fetch a URL.", ["read-only", "network"])
    assert described == "Fetch a URL. [tool-class: read-only, network]"
    assert declared_tool_classes(described) == frozenset({"read-only", "network"})
    assert declared_tool_classes("Fetch a URL.") is None, "no tag: nothing declared"
    kept = declared_tool_classes("x [tool-class: write, teleport]")
    assert kept == frozenset({"write", "teleport"}), "kept as written"
    assert declared_tool_classes("[tool-class: write] and more") is None, "the tag ends the description"
    with pytest.raises(ValueError):
        with_tool_classes("x", ["writes"])


def test_the_session_mode_rides_the_connect_metadata() -> None:
    metadata = connect_metadata("replay", 4, mode="allow-edits")
    assert (MODE, "allow-edits") in metadata
    seen = parse_connect_metadata(metadata)
    assert (seen.run_mode, seen.recorded_effects, seen.mode) == ("replay", 4, "allow-edits")
    assert parse_connect_metadata([(MODE, "sideways")]).mode == "", "a value that is no mode says nothing"
    assert parse_connect_metadata(connect_metadata("live", 0)).mode == ""


async def test_the_coding_harness_declares_its_classes_and_follows_the_announced_mode() -> None:
    harness = CodingHarness(workspace="/", mode="auto")
    descriptor = await harness.describe()
    declared = {spec.name: declared_tool_classes(spec.description) for spec in descriptor.tools}
    assert declared == {
        "read_file": frozenset({"read-only"}),
        "list_dir": frozenset({"read-only"}),
        "write_file": frozenset({"write"}),
        "edit_file": frozenset({"write"}),
        "run_shell": frozenset({"subprocess"}),
    }
    env = HarnessEnvironment(harness, model=["nothing to change"], host_mode="plan")
    await env.run("look around")
    assert [tool.name for tool in env.requests[0].tools] == ["read_file", "list_dir"]
