"""HostConfig: flags, AGENTSESSIONS_* variables, defaults, and the startup rules they must satisfy."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from agentsessions.host.config import ConfigError, HostConfig, add_arguments
from agentsessions.host.limits import Limits


def resolve(argv: list[str], environ: dict[str, str] | None = None) -> HostConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return HostConfig.from_sources(parser.parse_args(argv), environ or {})


def test_defaults() -> None:
    config = resolve([])
    assert config.listen == "127.0.0.1:50051"
    assert (config.journal, config.journal_kind) == ("agentsessions.db", "sqlite")
    assert config.project == "default"
    assert (config.log_level, config.log_format) == ("info", "text")
    assert config.harnesses == []
    assert config.registry_addr is None
    assert config.model == ""
    assert config.model_base_url == "https://api.openai.com/v1"
    assert config.model_path == "/chat/completions"
    assert config.model_auth_header == "Authorization"


def test_environment_fills_what_flags_leave_out_and_flags_win() -> None:
    environ = {
        "AGENTSESSIONS_LISTEN": "127.0.0.1:7000",
        "AGENTSESSIONS_PROJECT": "from-env",
        "AGENTSESSIONS_LOG_FORMAT": "json",
        "AGENTSESSIONS_DRAIN_GRACE": "2.5",
        "AGENTSESSIONS_HARNESS": "alpha=127.0.0.1:9001, beta=unix:/tmp/b.sock",
        "AGENTSESSIONS_MODEL": "gpt-env",
    }
    config = resolve(["--project", "from-flag"], environ)
    assert config.listen == "127.0.0.1:7000"
    assert config.project == "from-flag"
    assert config.log_format == "json"
    assert config.drain_grace_seconds == 2.5
    assert config.harnesses == [("alpha", "127.0.0.1:9001"), ("beta", "unix:/tmp/b.sock")]
    assert config.model == "gpt-env"

    # Any --harness flag replaces the environment's list rather than adding to it.
    flagged = resolve(["--harness", "gamma=localhost:9003"], environ)
    assert flagged.harnesses == [("gamma", "localhost:9003")]


def test_write_ahead_model_calls_is_off_unless_a_flag_or_the_environment_asks() -> None:
    assert resolve([]).write_ahead_model_calls is False
    assert resolve(["--write-ahead-model-calls"]).write_ahead_model_calls is True
    environ = {"AGENTSESSIONS_WRITE_AHEAD_MODEL_CALLS": "true"}
    assert resolve([], environ).write_ahead_model_calls is True
    assert resolve([], {"AGENTSESSIONS_WRITE_AHEAD_MODEL_CALLS": "off"}).write_ahead_model_calls is False
    with pytest.raises(ConfigError, match="AGENTSESSIONS_WRITE_AHEAD_MODEL_CALLS 'maybe' is not a boolean"):
        resolve([], {"AGENTSESSIONS_WRITE_AHEAD_MODEL_CALLS": "maybe"})


def test_the_model_key_comes_from_the_environment_and_never_shows_in_repr() -> None:
    config = resolve([], {"OPENAI_API_KEY": "sk-fallback", "MODEL_API_KEY": "sk-preferred"})
    assert config.model_api_key == "sk-preferred"
    assert "sk-preferred" not in repr(config)
    assert resolve([], {"OPENAI_API_KEY": "sk-fallback"}).model_api_key == "sk-fallback"


@pytest.mark.parametrize(
    ("location", "kind"),
    [
        ("memory:", "memory"),
        ("agentsessions.db", "sqlite"),
        ("/var/lib/agentsessions/journal.db", "sqlite"),
        ("postgres://u@localhost/db", "postgres"),
        ("postgresql://u@localhost:5432/db", "postgres"),
    ],
)
def test_journal_locations(location: str, kind: str) -> None:
    assert HostConfig(journal=location).journal_kind == kind


@pytest.mark.parametrize("location", ["", "mysql://localhost/db", "redis:"])
def test_unknown_journal_locations_are_refused(location: str) -> None:
    with pytest.raises(ConfigError, match="--journal"):
        HostConfig(journal=location)


@pytest.mark.parametrize(
    "address",
    [
        "localhost:9000",
        "127.0.0.1:9000",
        "[::1]:9000",
        "harness.svc.cluster.local:443",
        "dns:///harness.example:9000",
        "dns://8.8.8.8/harness.example:9000",
        "dns://resolver.local:53/harness.example:9000",
        "unix:harness.sock",
        "unix:/run/harness.sock",
        "unix:///run/harness.sock",
    ],
)
def test_accepted_harness_addresses(address: str) -> None:
    assert HostConfig(harnesses=[("mine", address)]).harnesses == [("mine", address)]


@pytest.mark.parametrize(
    "address",
    [
        "",
        "localhost",
        "localhost:",
        "localhost:0",
        "localhost:70000",
        "localhost:http",
        "::1:9000",
        "dns:harness:9000",
        "dns:///harness",
        "dns://resolver",
        "unix:",
        "unix://relative.sock",
        "http://harness:9000",
        "bad_host:9000",
    ],
)
def test_refused_harness_addresses(address: str) -> None:
    with pytest.raises(ConfigError, match="--harness mine"):
        HostConfig(harnesses=[("mine", address)])


@pytest.mark.parametrize("name", ["echo", "chat", "Upper", "-dash", "dash-", "a" * 64, "under_score", ""])
def test_refused_harness_names(name: str) -> None:
    with pytest.raises(ConfigError, match="--harness"):
        HostConfig(harnesses=[(name, "localhost:9000")])


def test_a_harness_name_given_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="more than once"):
        HostConfig(harnesses=[("mine", "localhost:9000"), ("mine", "localhost:9001")])


def test_a_harness_entry_without_address_is_refused() -> None:
    with pytest.raises(ConfigError, match="NAME=ADDRESS"):
        resolve(["--harness", "mine"])


@pytest.mark.parametrize(
    ("registry", "why"),
    [
        ("localhost:9000", "not a literal IP"),
        ("10.0.0.1:9000", "not a loopback"),
        ("127.0.0.1:0", "port"),
        ("127.0.0.1:50051", "must differ"),
    ],
)
def test_registry_address_rules(registry: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        HostConfig(registry_addr=registry)


def test_registry_address_on_loopback() -> None:
    assert HostConfig(registry_addr="127.0.0.1:50052").registry_addr == "127.0.0.1:50052"
    assert HostConfig(registry_addr="[::1]:50052").registry_addr == "[::1]:50052"


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "localhost:7000", "[::1]:50051", "unix:/tmp/host.sock"])
def test_listen_addresses(listen: str) -> None:
    assert HostConfig(listen=listen).listen == listen


@pytest.mark.parametrize("listen", ["0.0.0.0:8080", "[::]:50051", "10.1.2.3:50051", "example.com:50051"])
def test_a_listener_others_can_reach_needs_authentication(listen: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        resolve(["--listen", listen])
    assert str(refused.value).startswith(f"--listen {listen} is not a loopback address and no authentication")
    assert "--insecure-allow-unauthenticated" in str(refused.value)
    # Tokens, mutual TLS, or an explicit opt-out each let it start.
    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        json.dumps({"tokens": {"t" * 24: {"principal": "p", "projects": "*", "roles": ["admin"]}}})
    )
    assert resolve(["--listen", listen, "--auth-tokens", str(tokens)]).listen == listen
    pem = tmp_path / "x.pem"
    pem.write_text("not checked until the listener starts")
    mutual = ["--tls-cert", str(pem), "--tls-key", str(pem), "--tls-client-ca", str(pem)]
    assert resolve(["--listen", listen, *mutual]).listen == listen
    assert resolve(["--listen", listen, "--insecure-allow-unauthenticated"]).insecure_allow_unauthenticated
    by_env = resolve(
        [], {"AGENTSESSIONS_LISTEN": listen, "AGENTSESSIONS_INSECURE_ALLOW_UNAUTHENTICATED": "true"}
    )
    assert by_env.listen == listen
    with pytest.raises(
        ConfigError, match="AGENTSESSIONS_INSECURE_ALLOW_UNAUTHENTICATED 'maybe' is not a boolean"
    ):
        resolve([], {"AGENTSESSIONS_LISTEN": listen, "AGENTSESSIONS_INSECURE_ALLOW_UNAUTHENTICATED": "maybe"})


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--listen", "50051"], "--listen"),
        (["--log-level", "loud"], "--log-level"),
        (["--log-format", "xml"], "--log-format"),
        (["--drain-grace", "soon"], "--drain-grace"),
        (["--drain-grace", "-1"], "--drain-grace"),
        (["--project", ""], "--project"),
        (["--model-path", "chat"], "--model-path"),
        (["--model", "m", "--model-base-url", "ftp://x"], "--model-base-url"),
    ],
)
def test_refused_values_name_their_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        resolve(argv)


def test_limits_have_defaults_flags_and_variables() -> None:
    config = resolve([])
    assert config.limits.max_identity_bytes == 1024
    assert config.limits.max_input_bytes == 1024 * 1024
    assert config.limits.max_record_bytes == 4 * 1024 * 1024 - 64 * 1024
    assert (config.limits.max_executions, config.limits.max_project_executions) == (512, 256)
    given = resolve(
        ["--max-input-bytes", "2048", "--max-executions", "8"],
        {"AGENTSESSIONS_MAX_PROJECT_EXECUTIONS": "4", "AGENTSESSIONS_MAX_INPUT_BYTES": "9"},
    )
    assert (given.limits.max_input_bytes, given.limits.max_executions) == (2048, 8)
    assert given.limits.max_project_executions == 4
    assert config.limits.max_read_loop_percent == 1
    assert config.limits == Limits()  # the flags' defaults are the limits' own (DEFAULT_LIMITS)
    assert resolve(["--max-read-loop-percent", "0"]).limits.max_read_loop_percent == 0  # never paced
    paced = resolve([], {"AGENTSESSIONS_MAX_READ_LOOP_PERCENT": "12"})
    assert paced.limits.max_read_loop_percent == 12
    assert config.limits.max_listed_sessions_per_s == 10_000
    assert resolve(["--max-listed-sessions-per-s", "0"]).limits.max_listed_sessions_per_s == 0
    assert config.limits.max_kept_listed_sessions == 16_384
    assert resolve(["--max-kept-listed-sessions", "0"]).limits.max_kept_listed_sessions == 0
    kept = resolve([], {"AGENTSESSIONS_MAX_KEPT_LISTED_SESSIONS": "100"})
    assert kept.limits.max_kept_listed_sessions == 100


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--max-record-bytes", "5000000"], "--max-record-bytes 5000000 must be at most 4128768"),
        (["--max-input-bytes", "2000", "--max-record-bytes", "1000"], "must not exceed --max-record-bytes"),
        (["--max-executions", "2", "--max-project-executions", "3"], "must not exceed --max-executions 2"),
        (["--max-identity-bytes", "0"], "--max-identity-bytes 0 must be at least 1"),
        (["--max-read-loop-percent", "-1"], "--max-read-loop-percent -1 must be at least 0"),
        (["--max-read-loop-percent", "101"], "--max-read-loop-percent 101 must be at most 100"),
        (["--max-kept-listed-sessions", "-1"], "--max-kept-listed-sessions -1 must be at least 0"),
        (["--max-executions", "many"], "--max-executions 'many' is not an integer"),
    ],
)
def test_limits_are_checked_at_startup(argv: list[str], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        resolve(argv)


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--max-read-records-per-s", "2000"], {}),
        ([], {"AGENTSESSIONS_MAX_READ_RECORDS_PER_S": "2000"}),
    ],
)
def test_a_retired_limit_is_refused_naming_what_replaced_it(argv: list[str], environ: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="--max-read-records-per-s was replaced by --max-read-loop-percent"):
        resolve(argv, environ)
