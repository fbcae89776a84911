"""The task tool's limits as host flags and environment variables: defaults, values, precise refusals."""

from __future__ import annotations

import argparse

import pytest

from agentsessions.host.config import ConfigError, HostConfig, add_arguments
from agentsessions.host.controller.subagents import SubagentSettings


def resolve(argv: list[str], environ: dict[str, str] | None = None) -> HostConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return HostConfig.from_sources(parser.parse_args(argv), environ or {})


def test_defaults_flags_and_variables() -> None:
    assert resolve([]).subagents == SubagentSettings(max_children=8, max_depth=1, wait_timeout_s=3600.0)
    config = resolve(
        ["--subagent-max-children", "3", "--subagent-wait-timeout", "2.5"],
        {"AGENTSESSIONS_SUBAGENT_MAX_DEPTH": "2", "AGENTSESSIONS_SUBAGENT_MAX_CHILDREN": "5"},
    )
    assert (config.subagents.max_children, config.subagents.max_depth) == (3, 2)  # the flag wins
    assert config.subagents.wait_timeout_s == 2.5


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--subagent-max-children", "0"], "--subagent-max-children '0' must be an integer of at least 1"),
        (
            ["--subagent-max-children", "many"],
            "--subagent-max-children 'many' must be an integer of at least 1",
        ),
        (["--subagent-max-depth", "-1"], "--subagent-max-depth '-1' must be an integer of at least 0"),
        (["--subagent-max-depth", "1.5"], "--subagent-max-depth '1.5' must be an integer of at least 0"),
        (
            ["--subagent-wait-timeout", "0"],
            "--subagent-wait-timeout '0' must be a positive number of seconds",
        ),
        (
            ["--subagent-wait-timeout", "soon"],
            "--subagent-wait-timeout 'soon' must be a positive number of seconds",
        ),
    ],
)
def test_refused_values_name_their_flag_and_rule(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        resolve(argv)
    assert str(refused.value) == message


def test_a_variable_is_checked_as_its_flag() -> None:
    with pytest.raises(ConfigError, match="--subagent-max-depth 'deep'"):
        resolve([], {"AGENTSESSIONS_SUBAGENT_MAX_DEPTH": "deep"})
