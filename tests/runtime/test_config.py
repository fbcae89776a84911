"""``--harness-process NAME=MODULE:ATTR``: flag and environment, the name rules ``--harness`` has,
the target form, and what the command line says when a target cannot start."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import pytest

from agentsessions.host.config import ConfigError, HostConfig, add_arguments
from tests.runtime.hosting import REPO

AGENTSESSIONS = Path(sys.executable).parent / "agentsessions"
PID = "tests.runtime.harnesses:PidHarness"


def resolve(argv: list[str], environ: dict[str, str] | None = None) -> HostConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return HostConfig.from_sources(parser.parse_args(argv), environ or {})


def test_flags_and_environment() -> None:
    assert resolve([]).harness_processes == []
    environ = {"AGENTSESSIONS_HARNESS_PROCESS": "one=pkg.agent:One, two=pkg.other:make_two"}
    assert resolve([], environ).harness_processes == [("one", "pkg.agent:One"), ("two", "pkg.other:make_two")]
    # Any flag replaces the environment's list rather than adding to it.
    flagged = resolve(["--harness-process", "three=pkg.three:Harness.create"], environ)
    assert flagged.harness_processes == [("three", "pkg.three:Harness.create")]


@pytest.mark.parametrize(
    "name", ["echo", "chat", "counter", "Upper", "-dash", "dash-", "a" * 64, "under_score", ""]
)
def test_names_follow_the_harness_rules(name: str) -> None:
    with pytest.raises(ConfigError, match="--harness-process name"):
        HostConfig(harness_processes=[(name, PID)])


def test_a_name_is_given_once_across_harness_and_harness_process() -> None:
    with pytest.raises(ConfigError, match="more than once"):
        HostConfig(harness_processes=[("mine", PID), ("mine", PID)])
    with pytest.raises(ConfigError, match="--harness-process 'mine' names a harness given more than once"):
        HostConfig(harnesses=[("mine", "localhost:9000")], harness_processes=[("mine", PID)])


@pytest.mark.parametrize(
    "target",
    [
        "",
        "module",
        "module:",
        ":Attr",
        "pkg/mod:Attr",
        "pkg.mod:Attr()",
        "1pkg:Attr",
        "pkg.mod:Attr:More",
        "a b:C",
    ],
)
def test_targets_must_be_module_colon_attribute(target: str) -> None:
    with pytest.raises(ConfigError, match=r"--harness-process mine target .* must be MODULE:ATTR"):
        HostConfig(harness_processes=[("mine", target)])


def test_an_entry_without_a_target_is_refused() -> None:
    with pytest.raises(ConfigError, match="NAME=MODULE:ATTR"):
        resolve(["--harness-process", "mine"])


@pytest.mark.e2e
async def test_serve_with_a_target_that_cannot_start_exits_1_naming_it(tmp_path: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        str(AGENTSESSIONS),
        "serve",
        "--journal",
        "memory:",
        "--listen",
        "127.0.0.1:0",
        "--harness-process",
        "broken=tests.runtime.no_such_module:Harness",
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(60):
        output, _ = await process.communicate()
    text = output.decode()
    assert process.returncode == 1, text
    assert "startup failed" in text
    assert "harness process 'broken'" in text and "cannot import 'tests.runtime.no_such_module'" in text


async def test_serve_with_a_malformed_entry_exits_2_naming_the_flag() -> None:
    process = await asyncio.create_subprocess_exec(
        str(AGENTSESSIONS),
        "serve",
        "--journal",
        "memory:",
        "--harness-process",
        "broken=not a target",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    async with asyncio.timeout(60):
        output, _ = await process.communicate()
    assert process.returncode == 2
    assert "--harness-process broken target 'not a target' must be MODULE:ATTR" in output.decode()
