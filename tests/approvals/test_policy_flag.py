"""``--approval-policy PATH`` (env ``AGENTSESSIONS_APPROVAL_POLICY``) reaches the controller; a bad
file stops startup with a message naming the flag and the rule."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from agentsessions.host.app import build_app
from agentsessions.host.config import ConfigError, HostConfig, add_arguments


def parse(argv: list[str], environ: dict[str, str] | None = None) -> HostConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return HostConfig.from_sources(parser.parse_args(argv), environ or {})


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.json"
    document = {
        "expire_after_s": 60,
        "projects": {"ops": {"rules": [{"tool": "deploy", "decision": "deny"}]}},
    }
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def test_flag_and_environment(policy_file: Path, tmp_path: Path) -> None:
    assert parse([]).approval_policy is None
    assert parse(["--approval-policy", str(policy_file)]).approval_policy == str(policy_file)
    env = {"AGENTSESSIONS_APPROVAL_POLICY": str(policy_file)}
    assert parse([], env).approval_policy == str(policy_file)
    other = tmp_path / "other.json"
    other.write_text("{}", encoding="utf-8")
    assert parse(["--approval-policy", str(other)], env).approval_policy == str(other), "the flag wins"


def test_a_bad_policy_stops_startup(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rules": [{"tool": "x", "decision": "perhaps"}]}), encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        parse(["--approval-policy", str(bad)])
    assert str(err.value).startswith("--approval-policy ")
    assert "rules[0]: decision must be 'approve' or 'deny'" in str(err.value)
    with pytest.raises(ConfigError, match="--approval-policy"):
        parse(["--approval-policy", str(tmp_path / "absent.toml")])


async def test_the_policy_reaches_the_controller(policy_file: Path) -> None:
    app = await build_app(
        HostConfig(listen="127.0.0.1:0", journal="memory:", approval_policy=str(policy_file))
    )
    try:
        assert app.controller is not None
        policy = app.controller.approval_policy
        assert policy.expiry_for("default") == 60
        assert [rule.tool for rule in policy.rules_for("ops")] == ["deploy"]
    finally:
        await app.close()
    plain = await build_app(HostConfig(listen="127.0.0.1:0", journal="memory:"))
    try:
        assert plain.controller is not None
        assert plain.controller.approval_policy.expiry_for("default") is None
        assert plain.controller.approval_policy.rules_for("ops") == ()
    finally:
        await plain.close()
