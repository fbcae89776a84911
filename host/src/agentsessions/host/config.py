"""The host's configuration: one ``HostConfig`` from ``serve`` flags and ``AGENTSESSIONS_*`` variables.

A flag wins over its environment variable, which wins over the default. Everything is validated when
the ``HostConfig`` is built, so a bad value stops startup with a message naming the flag and the rule.
The model provider's key is read from the environment only (never argv), so it never shows in ``ps``.
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Literal, TypedDict, cast

from agentsessions.host import addresses
from agentsessions.host import limits as host_limits
from agentsessions.host.addresses import AddressError
from agentsessions.host.auth.principals import AuthFileError, load_principals
from agentsessions.host.controller import results
from agentsessions.host.controller.approval_policy import ApprovalPolicy, ApprovalPolicyError
from agentsessions.host.controller.subagents import SubagentSettings
from agentsessions.host.journal import JournalKind, JournalLocationError, parse_location
from agentsessions.host.models import openai
from agentsessions.host.models.policy import RetryPolicy
from agentsessions.sdk.structs import struct
from agentsessions.sdk.tls import ClientTLS, ServerTLS

ENV_PREFIX = "AGENTSESSIONS_"

DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_JOURNAL = "agentsessions.db"
DEFAULT_PROJECT = "default"
DEFAULT_DRAIN_GRACE_SECONDS = 10.0
# How long a harness's descriptor serves admissions on one connection (agentsessions.host.harnesslink).
DEFAULT_DESCRIBE_MAX_AGE_SECONDS = 5.0
# Live sessions (docs/live.md): leases, automatic recovery, idempotency keys.
DEFAULT_LEASE_TTL_SECONDS = 15.0
DEFAULT_RECOVER_ATTEMPTS = 3
DEFAULT_RECOVER_BACKOFF_SECONDS = 1.0
DEFAULT_IDEMPOTENCY_RETENTION_SECONDS = 24 * 3600.0
RECOVER_MODES = ("on", "off")
# The provider's own defaults (agentsessions.host.models.openai), so a flag's help and default match it.
DEFAULT_MODEL_BASE_URL = openai.DEFAULT_BASE_URL
DEFAULT_MODEL_PATH = openai.DEFAULT_PATH
DEFAULT_MODEL_AUTH_HEADER = "Authorization"

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
OTEL_EXPORTERS = ("none", "console", "otlp")

# Names the host always serves itself; a remote harness may not take them.
RESERVED_HARNESS_NAMES = frozenset({"echo", "chat", "counter"})

LogFormat = Literal["text", "json"]
OtelExporter = Literal["none", "console", "otlp"]

# module:attribute, both dotted Python identifiers (what agentsessions-harness serve loads).
_HARNESS_TARGET = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", re.ASCII)
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class ConfigError(ValueError):
    """A configuration value breaks a rule; the message names the flag."""


@struct(frozen=True)
class HostConfig:
    """Everything ``agentsessions serve`` needs to start. Construct directly in tests."""

    listen: str = DEFAULT_LISTEN
    journal: str = DEFAULT_JOURNAL
    project: str = DEFAULT_PROJECT
    log_level: str = "info"
    log_format: LogFormat = "text"
    drain_grace_seconds: float = DEFAULT_DRAIN_GRACE_SECONDS
    # Remote harnesses as (name, address) pairs, in flag order.
    harnesses: list[tuple[str, str]] = field(default_factory=list)
    # Harness processes the host starts, as (name, module:attribute) pairs (see agentsessions.host.runtime).
    harness_processes: list[tuple[str, str]] = field(default_factory=list)
    # 0: Describe at every admission (the reference's behaviour).
    harness_describe_max_age: float = DEFAULT_DESCRIBE_MAX_AGE_SECONDS
    registry_addr: str | None = None
    # Empty means the built-in echo model.
    model: str = ""
    model_base_url: str = DEFAULT_MODEL_BASE_URL
    model_path: str = DEFAULT_MODEL_PATH
    model_auth_header: str = DEFAULT_MODEL_AUTH_HEADER
    model_api_key: str = field(default="", repr=False)
    # Host-run tools: --tool-executor, --mcp-server, --tools-config (see agentsessions.host.tools.config).
    tool_executors: list[str] = field(default_factory=list)
    mcp_servers: list[str] = field(default_factory=list)
    tools_files: list[str] = field(default_factory=list)
    # DeleteSession drops the journal rows too (default: rows kept, session hidden).
    purge_on_delete: bool = False
    # Each MODEL_CALL durable before its model is asked (default: ordered at once, durable with the
    # call's answer or within milliseconds; controller/writer.py ExecutionWriter).
    write_ahead_model_calls: bool = False
    # Host decisions at approval gates: rules, session grants, expiry (docs/approvals.md).
    approval_policy: str | None = None
    # Request, record and concurrency limits (agentsessions.host.limits).
    limits: host_limits.Limits = field(default_factory=lambda: host_limits.DEFAULT_LIMITS)
    # TLS on the Sessions and registry listeners; a client CA makes it mutual TLS (docs/security.md).
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    # TLS when dialling harnesses: the CA that verifies them, and the host's own certificate for mTLS.
    harness_tls_ca: str | None = None
    harness_tls_cert: str | None = None
    harness_tls_key: str | None = None
    # Tokens and certificate identities -> principals (agentsessions.host.auth); None: no authentication.
    auth_tokens: str | None = None
    # Serve a non-loopback --listen without --auth-tokens or mutual TLS (refused otherwise).
    insecure_allow_unauthenticated: bool = False
    # Where traces and metrics go (agentsessions.host.telemetry).
    otel_exporter: OtelExporter = "none"
    # The model provider's timeouts and retries (the block at the end of this module).
    model_transport: ModelTransportConfig = field(default_factory=lambda: ModelTransportConfig())
    # The HTTP API and web console listener (agentsessions.host.http); None: not served.
    http_listen: str | None = None
    # Interrupted executions are recovered by whichever host takes their expired lease (off: Resume).
    recover: bool = True
    recover_attempts: int = DEFAULT_RECOVER_ATTEMPTS
    recover_backoff_seconds: float = DEFAULT_RECOVER_BACKOFF_SECONDS
    lease_ttl_seconds: float = DEFAULT_LEASE_TTL_SECONDS
    idempotency_retention_seconds: float = DEFAULT_IDEMPOTENCY_RETENTION_SECONDS
    # Plain Exec turns run to their end when their caller goes away (default: cancelled, as the reference).
    detach_exec: bool = False
    # The task tool's limits: children per turn, depth, wait timeout (docs/subagents.md).
    subagents: SubagentSettings = field(default_factory=SubagentSettings)
    # Corrective turns a turn bound to a result schema may take (controller/results.py).
    result_corrections: int = results.DEFAULT_CORRECTIONS
    # Compact before a turn whose history since the latest baseline holds more events (0: never).
    compact_above_events: int = 0
    # ... or more bytes of encoded events (0: never); either threshold triggers.
    compact_above_bytes: int = 0

    def __post_init__(self) -> None:
        check_listen_address("--listen", self.listen)
        journal_kind(self.journal)
        if self.approval_policy is not None:
            check_approval_policy(self.approval_policy)
        if not self.project:
            raise ConfigError("--project must not be empty")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"--log-level {self.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
        if self.log_format not in LOG_FORMATS:
            raise ConfigError(f"--log-format {self.log_format!r} is not one of {', '.join(LOG_FORMATS)}")
        if not self.drain_grace_seconds >= 0:
            raise ConfigError(f"--drain-grace {self.drain_grace_seconds} must be a number of seconds >= 0")
        if not self.harness_describe_max_age >= 0:
            raise ConfigError(
                f"--harness-describe-max-age {self.harness_describe_max_age} must be a number of seconds >= 0"
            )
        seen: set[str] = set()
        for name, address in self.harnesses:
            check_harness_name(name)
            if name in seen:
                raise ConfigError(f"--harness {name!r} is given more than once")
            seen.add(name)
            check_harness_address(f"--harness {name}", address)
        for name, target in self.harness_processes:
            check_harness_name(name, "--harness-process")
            if name in seen:
                raise ConfigError(f"--harness-process {name!r} names a harness given more than once")
            seen.add(name)
            check_harness_target(name, target)
        if self.registry_addr is not None:
            check_registry_address(self.registry_addr, self.listen)
        if self.model_path and not self.model_path.startswith("/"):
            raise ConfigError(f"--model-path {self.model_path!r} must start with '/'")
        if self.model and not self.model_base_url.startswith(("http://", "https://")):
            raise ConfigError(f"--model-base-url {self.model_base_url!r} must be an http:// or https:// URL")
        self._check_tls()
        if self.auth_tokens is not None:
            check_auth_tokens(self.auth_tokens)
        check_authenticated_listener(
            self.listen, self.auth_tokens, self.tls_client_ca, self.insecure_allow_unauthenticated
        )
        self._check_live()
        if self.compact_above_events < 0:
            raise ConfigError(f"--compact-above-events {self.compact_above_events} must be 0 (off) or more")
        if self.compact_above_bytes < 0:
            raise ConfigError(f"--compact-above-bytes {self.compact_above_bytes} must be 0 (off) or more")
        if not 0 <= self.result_corrections <= results.MAX_CORRECTIONS:
            raise ConfigError(
                f"--result-corrections {self.result_corrections} must be 0 to {results.MAX_CORRECTIONS}"
            )
        if self.otel_exporter not in OTEL_EXPORTERS:
            raise ConfigError(
                f"--otel-exporter {self.otel_exporter!r} is not one of {', '.join(OTEL_EXPORTERS)}"
            )
        if self.http_listen is not None:
            check_http_listen(self)

    def _check_live(self) -> None:
        if self.recover_attempts < 1:
            raise ConfigError(f"--recover-attempts {self.recover_attempts} must be at least 1")
        _check_positive_seconds(
            ("--recover-backoff", self.recover_backoff_seconds),
            ("--lease-ttl", self.lease_ttl_seconds),
            ("--idempotency-retention", self.idempotency_retention_seconds),
        )

    def _check_tls(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ConfigError("--tls-client-ca (mutual TLS) needs --tls-cert and --tls-key")
        if (self.harness_tls_cert is None) != (self.harness_tls_key is None):
            raise ConfigError("--harness-tls-cert and --harness-tls-key go together")
        if self.harness_tls_cert is not None and self.harness_tls_ca is None:
            raise ConfigError("--harness-tls-cert (mutual TLS to harnesses) needs --harness-tls-ca")
        for flag, path in (
            ("--tls-cert", self.tls_cert),
            ("--tls-key", self.tls_key),
            ("--tls-client-ca", self.tls_client_ca),
            ("--harness-tls-ca", self.harness_tls_ca),
            ("--harness-tls-cert", self.harness_tls_cert),
            ("--harness-tls-key", self.harness_tls_key),
        ):
            if path is not None:
                _check_file(flag, path)

    @property
    def server_tls(self) -> ServerTLS | None:
        """The listeners' TLS (None: plaintext)."""
        if self.tls_cert is None or self.tls_key is None:
            return None
        return ServerTLS(self.tls_cert, self.tls_key, self.tls_client_ca)

    @property
    def harness_tls(self) -> ClientTLS | None:
        """How the host dials harnesses over TLS (None: plaintext)."""
        if self.harness_tls_ca is None:
            return None
        return ClientTLS(self.harness_tls_ca, self.harness_tls_cert, self.harness_tls_key)

    @property
    def journal_kind(self) -> JournalKind:
        """Which store the journal location names: memory, sqlite (a file path) or postgres (a URL)."""
        return journal_kind(self.journal)

    @classmethod
    def from_sources(cls, args: argparse.Namespace, environ: Mapping[str, str]) -> HostConfig:
        """Resolve each setting as flag, else ``AGENTSESSIONS_<NAME>``, else the default."""

        pick = functools.partial(_setting, args, environ)
        grace = _seconds("--drain-grace", pick("drain_grace", str(DEFAULT_DRAIN_GRACE_SECONDS)))
        describe_max_age = _seconds(
            "--harness-describe-max-age",
            pick("harness_describe_max_age", str(DEFAULT_DESCRIBE_MAX_AGE_SECONDS)),
        )

        flag_harnesses: list[str] | None = getattr(args, "harness", None)
        if flag_harnesses:
            harness_entries: Sequence[str] = flag_harnesses
        else:
            harness_entries = environ.get(ENV_PREFIX + "HARNESS", "").replace(",", " ").split()
        process_entries: Sequence[str] = getattr(args, "harness_process", None) or (
            environ.get(ENV_PREFIX + "HARNESS_PROCESS", "").replace(",", " ").split()
        )

        return cls(
            listen=pick("listen", DEFAULT_LISTEN),
            journal=pick("journal", DEFAULT_JOURNAL),
            project=pick("project", DEFAULT_PROJECT),
            log_level=pick("log_level", "info").lower(),
            log_format=cast(LogFormat, pick("log_format", "text").lower()),
            drain_grace_seconds=grace,
            harnesses=[parse_harness_entry(entry) for entry in harness_entries],
            harness_processes=[parse_harness_process_entry(entry) for entry in process_entries],
            harness_describe_max_age=describe_max_age,
            registry_addr=pick("registry_addr", "") or None,
            model=pick("model", ""),
            model_base_url=pick("model_base_url", DEFAULT_MODEL_BASE_URL),
            model_path=pick("model_path", DEFAULT_MODEL_PATH),
            model_auth_header=pick("model_auth_header", DEFAULT_MODEL_AUTH_HEADER),
            model_api_key=openai.api_key_from_env(environ),
            tool_executors=_split(
                getattr(args, "tool_executor", None) or [], environ.get(ENV_PREFIX + "TOOL_EXECUTOR")
            ),
            mcp_servers=_split(
                getattr(args, "mcp_server", None) or [], environ.get(ENV_PREFIX + "MCP_SERVER"), sep=";"
            ),
            tools_files=_split(
                getattr(args, "tools_config", None) or [], environ.get(ENV_PREFIX + "TOOLS_CONFIG")
            ),
            purge_on_delete=_flag(
                getattr(args, "purge_on_delete", None), environ.get(ENV_PREFIX + "PURGE_ON_DELETE")
            ),
            write_ahead_model_calls=_flag(
                getattr(args, "write_ahead_model_calls", None),
                environ.get(ENV_PREFIX + "WRITE_AHEAD_MODEL_CALLS"),
                "WRITE_AHEAD_MODEL_CALLS",
            ),
            approval_policy=getattr(args, "approval_policy", None)
            or environ.get(ENV_PREFIX + "APPROVAL_POLICY")
            or None,
            limits=_limits(args, environ),
            subagents=_subagents(args, environ),
            tls_cert=pick("tls_cert", "") or None,
            tls_key=pick("tls_key", "") or None,
            tls_client_ca=pick("tls_client_ca", "") or None,
            harness_tls_ca=pick("harness_tls_ca", "") or None,
            harness_tls_cert=pick("harness_tls_cert", "") or None,
            harness_tls_key=pick("harness_tls_key", "") or None,
            auth_tokens=pick("auth_tokens", "") or None,
            insecure_allow_unauthenticated=_flag(
                getattr(args, "insecure_allow_unauthenticated", None),
                environ.get(ENV_PREFIX + "INSECURE_ALLOW_UNAUTHENTICATED"),
                "INSECURE_ALLOW_UNAUTHENTICATED",
            ),
            otel_exporter=cast(OtelExporter, pick("otel_exporter", "none").lower()),
            model_transport=ModelTransportConfig.from_sources(args, environ),
            http_listen=pick("http_listen", "") or None,
            **_live_from_sources(args, environ),
            result_corrections=_integer(args, environ, "--result-corrections", results.DEFAULT_CORRECTIONS),
            compact_above_events=_integer(args, environ, "--compact-above-events", 0),
            compact_above_bytes=_integer(args, environ, "--compact-above-bytes", 0),
        )


# The task tool's flags (docs/subagents.md): (flag, attribute, what it must be).
_SUBAGENT_FLAGS = (
    ("--subagent-max-children", "subagent_max_children", "an integer of at least 1"),
    ("--subagent-max-depth", "subagent_max_depth", "an integer of at least 0"),
    ("--subagent-wait-timeout", "subagent_wait_timeout", "a positive number of seconds"),
)


def _subagents(args: argparse.Namespace, environ: Mapping[str, str]) -> SubagentSettings:
    defaults = SubagentSettings()
    values: list[float] = []
    for (flag, attr, rule), default in zip(
        _SUBAGENT_FLAGS, (defaults.max_children, defaults.max_depth, defaults.wait_timeout_s), strict=True
    ):
        given: str | None = getattr(args, attr, None)
        text = given if given is not None else environ.get(ENV_PREFIX + attr.upper(), f"{default:g}")
        try:
            value = float(text) if attr == "subagent_wait_timeout" else int(text)
        except ValueError:
            raise ConfigError(f"{flag} {text!r} must be {rule}") from None
        if (
            (attr == "subagent_max_children" and value < 1)
            or value < 0
            or (attr == "subagent_wait_timeout" and value <= 0)
        ):
            raise ConfigError(f"{flag} {text!r} must be {rule}")
        values.append(value)
    return SubagentSettings(max_children=int(values[0]), max_depth=int(values[1]), wait_timeout_s=values[2])


def add_subagent_arguments(parser: argparse.ArgumentParser) -> None:
    """The task tool's limits (docs/subagents.md)."""
    env = ENV_PREFIX
    defaults = SubagentSettings()
    parser.add_argument(
        "--subagent-max-children",
        metavar="N",
        help=f"task children one turn may start; the next task call gets an error result at once "
        f"(env {env}SUBAGENT_MAX_CHILDREN; default {defaults.max_children})",
    )
    parser.add_argument(
        "--subagent-max-depth",
        metavar="N",
        help=f"how deep task children may nest (1: a child may not delegate; 0: no task tool) "
        f"(env {env}SUBAGENT_MAX_DEPTH; default {defaults.max_depth})",
    )
    parser.add_argument(
        "--subagent-wait-timeout",
        metavar="SECONDS",
        help=f"how long a parent waits for a child; then the child is cancelled and the call gets an "
        f"error result (env {env}SUBAGENT_WAIT_TIMEOUT; default {defaults.wait_timeout_s:g})",
    )


def _integer(args: argparse.Namespace, environ: Mapping[str, str], flag: str, default: int) -> int:
    attr = flag.removeprefix("--").replace("-", "_")
    value: str | None = getattr(args, attr, None)
    text = value if value is not None else environ.get(ENV_PREFIX + attr.upper(), str(default))
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{flag} {text!r} is not an integer") from None


def _limits(args: argparse.Namespace, environ: Mapping[str, str]) -> host_limits.Limits:
    try:
        return host_limits.Limits.from_sources(args, environ)
    except host_limits.LimitsError as exc:
        raise ConfigError(str(exc)) from None


class _LiveOptions(TypedDict):
    recover: bool
    recover_attempts: int
    recover_backoff_seconds: float
    lease_ttl_seconds: float
    idempotency_retention_seconds: float
    detach_exec: bool


def _live_from_sources(args: argparse.Namespace, environ: Mapping[str, str]) -> _LiveOptions:
    pick = functools.partial(_setting, args, environ)

    def number(flag: str, attr: str, default: float) -> float:
        return _seconds(flag, pick(attr, str(default)))

    mode = pick("recover", "on").lower()
    if mode not in RECOVER_MODES:
        raise ConfigError(f"--recover {mode!r} is not one of {', '.join(RECOVER_MODES)}")
    attempts_text = pick("recover_attempts", str(DEFAULT_RECOVER_ATTEMPTS))
    try:
        attempts = int(attempts_text)
    except ValueError:
        raise ConfigError(f"--recover-attempts {attempts_text!r} is not an integer") from None
    detach = _flag(getattr(args, "detach_exec", None), environ.get(ENV_PREFIX + "DETACH_EXEC"), "DETACH_EXEC")
    return _LiveOptions(
        recover=mode == "on",
        recover_attempts=attempts,
        recover_backoff_seconds=number(
            "--recover-backoff", "recover_backoff", DEFAULT_RECOVER_BACKOFF_SECONDS
        ),
        lease_ttl_seconds=number("--lease-ttl", "lease_ttl", DEFAULT_LEASE_TTL_SECONDS),
        idempotency_retention_seconds=number(
            "--idempotency-retention", "idempotency_retention", DEFAULT_IDEMPOTENCY_RETENTION_SECONDS
        ),
        detach_exec=detach,
    )


def _setting(args: argparse.Namespace, environ: Mapping[str, str], attr: str, default: str) -> str:
    """A setting's text: its flag, else ``AGENTSESSIONS_<ATTR>``, else ``default``."""
    value: str | None = getattr(args, attr, None)
    return value if value is not None else environ.get(ENV_PREFIX + attr.upper(), default)


def _seconds(flag: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{flag} {text!r} is not a number of seconds") from None


def _check_positive_seconds(*settings: tuple[str, float]) -> None:
    for flag, value in settings:
        if not value > 0:
            raise ConfigError(f"{flag} {value:g} must be a positive number of seconds")


def _check_file(flag: str, path: str) -> None:
    if not os.path.isfile(path):
        raise ConfigError(f"{flag} {path!r}: no such file")


def _split(flags: Sequence[str], env_value: str | None, sep: str = ",") -> list[str]:
    """A repeatable flag's values, else its environment variable split on ``sep``."""
    if flags:
        return list(flags)
    return [item.strip() for item in (env_value or "").split(sep) if item.strip()]


def _flag(flag: bool | None, env_value: str | None, name: str = "PURGE_ON_DELETE") -> bool:
    if flag is not None:
        return flag
    if env_value is None or env_value == "":
        return False
    if env_value.lower() in ("1", "true", "yes", "on"):
        return True
    if env_value.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{ENV_PREFIX}{name} {env_value!r} is not a boolean (true/false)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``serve`` flags. Defaults are None so ``from_sources`` can tell 'not given' from a value."""
    env = ENV_PREFIX
    parser.add_argument(
        "--listen",
        metavar="ADDR",
        help=f"Sessions gRPC listen address, host:port or unix:path "
        f"(env {env}LISTEN; default {DEFAULT_LISTEN})",
    )
    parser.add_argument(
        "--journal",
        metavar="LOCATION",
        help=f"journal: a SQLite file path, 'memory:', or a postgres:// URL "
        f"(env {env}JOURNAL; default {DEFAULT_JOURNAL})",
    )
    parser.add_argument(
        "--project",
        metavar="NAME",
        help=f"default project for sessions created without one "
        f"(env {env}PROJECT; default {DEFAULT_PROJECT})",
    )
    parser.add_argument(
        "--log-level", metavar="LEVEL", help=f"{'|'.join(LOG_LEVELS)} (env {env}LOG_LEVEL; default info)"
    )
    parser.add_argument(
        "--log-format", metavar="FORMAT", help=f"text|json log lines (env {env}LOG_FORMAT; default text)"
    )
    parser.add_argument(
        "--drain-grace",
        metavar="SECONDS",
        help=f"on SIGTERM/SIGINT, how long in-flight calls may finish (env {env}DRAIN_GRACE; "
        f"default {DEFAULT_DRAIN_GRACE_SECONDS:g})",
    )
    add_harness_arguments(parser)
    parser.add_argument(
        "--registry-addr",
        metavar="IP:PORT",
        help=f"literal loopback IP:port for a separate HarnessRegistry server (env {env}REGISTRY_ADDR)",
    )
    add_model_arguments(parser)
    parser.add_argument(
        "--tool-executor",
        action="append",
        metavar="python:MODULE:FUNC[=NAME]",
        help=f"host-run tool backed by a Python function, repeatable "
        f"(env {env}TOOL_EXECUTOR, comma-separated)",
    )
    parser.add_argument(
        "--mcp-server",
        action="append",
        metavar="NAME='CMD ARGS'",
        help=f"MCP server over stdio whose tools the host runs, repeatable "
        f"(env {env}MCP_SERVER, semicolon-separated)",
    )
    parser.add_argument(
        "--tools-config",
        action="append",
        metavar="PATH",
        help=f"JSON or TOML file of tool executors, repeatable (env {env}TOOLS_CONFIG, comma-separated)",
    )
    parser.add_argument(
        "--purge-on-delete",
        action="store_true",
        default=None,
        help=f"DeleteSession also drops the session's journal rows "
        f"(env {env}PURGE_ON_DELETE; default: keep them)",
    )
    parser.add_argument(
        "--write-ahead-model-calls",
        action="store_true",
        default=None,
        help=f"make each MODEL_CALL record durable before the model is asked, as the reference does "
        f"(env {env}WRITE_AHEAD_MODEL_CALLS; default: it is made durable with the call's answer, "
        f"or at most 10 ms after the call began, whichever comes first)",
    )
    parser.add_argument(
        "--approval-policy",
        metavar="PATH",
        help=f"JSON or TOML approval policy: per-project rules, session grants, expiry "
        f"(env {env}APPROVAL_POLICY; see docs/approvals.md)",
    )
    host_limits.add_arguments(parser)
    add_security_arguments(parser)
    add_http_arguments(parser)
    add_live_arguments(parser)
    add_subagent_arguments(parser)
    parser.add_argument(
        "--otel-exporter",
        metavar="KIND",
        help=f"where traces and metrics go: {'|'.join(OTEL_EXPORTERS)}; otlp reads OTEL_EXPORTER_OTLP_* "
        f"(env {env}OTEL_EXPORTER; default none; see docs/telemetry.md)",
    )


def add_live_arguments(parser: argparse.ArgumentParser) -> None:
    """Leases, automatic recovery, idempotency keys and detached Exec (docs/live.md)."""
    env = ENV_PREFIX
    parser.add_argument(
        "--recover",
        metavar="on|off",
        help=f"recover interrupted executions automatically, on whichever host takes their expired lease; "
        f"off: Resume does it, as in the reference (env {env}RECOVER; default on)",
    )
    parser.add_argument(
        "--recover-attempts",
        metavar="N",
        help=f"recovery attempts before a turn that keeps failing ends FAILED "
        f"(env {env}RECOVER_ATTEMPTS; default {DEFAULT_RECOVER_ATTEMPTS})",
    )
    parser.add_argument(
        "--recover-backoff",
        metavar="SECONDS",
        help=f"wait before the first retry of a failed turn, doubled for each one after it "
        f"(env {env}RECOVER_BACKOFF; default {DEFAULT_RECOVER_BACKOFF_SECONDS:g})",
    )
    parser.add_argument(
        "--lease-ttl",
        metavar="SECONDS",
        help=f"how long an execution's lease lasts unless its host renews it; another host recovers it "
        f"after that (env {env}LEASE_TTL; default {DEFAULT_LEASE_TTL_SECONDS:g})",
    )
    parser.add_argument(
        "--idempotency-retention",
        metavar="SECONDS",
        help=f"how long an idempotency-key is remembered (env {env}IDEMPOTENCY_RETENTION; "
        f"default {DEFAULT_IDEMPOTENCY_RETENTION_SECONDS:g}, 24 h)",
    )
    parser.add_argument(
        "--detach-exec",
        action="store_true",
        default=None,
        help=f"a plain Exec turn runs to its end when its caller goes away "
        f"(env {env}DETACH_EXEC; default: cancelled, as in the reference)",
    )
    parser.add_argument(
        "--result-corrections",
        metavar="N",
        help=f"corrective turns a turn bound to a result schema may take before it ends FAILED "
        f"(env {env}RESULT_CORRECTIONS; default {results.DEFAULT_CORRECTIONS})",
    )
    parser.add_argument(
        "--compact-above-events",
        metavar="N",
        help=f"compact a session (a summary as its new baseline) before a turn whose history since "
        f"the latest baseline holds more than N events (env {env}COMPACT_ABOVE_EVENTS; default 0: never)",
    )
    parser.add_argument(
        "--compact-above-bytes",
        metavar="N",
        help=f"compact a session before a turn whose history since the latest baseline is more than N "
        f"bytes of encoded events (env {env}COMPACT_ABOVE_BYTES; default 0: never; with "
        "--compact-above-events, either triggers)",
    )


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    """TLS on the listeners and authentication (docs/security.md)."""
    env = ENV_PREFIX
    parser.add_argument(
        "--tls-cert",
        metavar="PEM",
        help=f"serve TLS on the Sessions and registry listeners with this certificate chain "
        f"(env {env}TLS_CERT)",
    )
    parser.add_argument("--tls-key", metavar="PEM", help=f"the private key of --tls-cert (env {env}TLS_KEY)")
    parser.add_argument(
        "--tls-client-ca",
        metavar="PEM",
        help=f"require client certificates that chain to this CA: mutual TLS (env {env}TLS_CLIENT_CA)",
    )
    parser.add_argument(
        "--auth-tokens",
        metavar="FILE",
        help=f"JSON or TOML file mapping bearer tokens and client certificate identities to principals, "
        f"projects and roles; without it every caller is trusted, so bind loopback "
        f"(env {env}AUTH_TOKENS; see docs/security.md)",
    )
    parser.add_argument(
        "--insecure-allow-unauthenticated",
        action="store_true",
        default=None,
        help=f"serve a non-loopback --listen without --auth-tokens or mutual TLS, trusting every "
        f"caller that reaches it (env {env}INSECURE_ALLOW_UNAUTHENTICATED; default: refuse to start)",
    )


# -- the HTTP API and web console (agentsessions.host.http, docs/http.md) ------------------------


def add_http_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--http-listen",
        metavar="HOST:PORT",
        help=f"also serve the HTTP API (JSON, Server-Sent Events) and the web console here, such as "
        f"127.0.0.1:8080; port 0 picks a free one (env {ENV_PREFIX}HTTP_LISTEN; default: not served; "
        "see docs/http.md)",
    )


def check_http_listen(config: HostConfig) -> None:
    """A TCP host:port of its own. Browsers reach it, so off loopback it needs credentials the
    console can present (--auth-tokens) or a handshake that refuses strangers (--tls-client-ca)."""
    address = config.http_listen or ""
    if address.startswith("unix:"):
        raise ConfigError(
            f"--http-listen {address!r}: must be host:port (browsers cannot reach a unix socket)"
        )
    check_listen_address("--http-listen", address)
    if not address.endswith(":0") and address in (config.listen, config.registry_addr):
        raise ConfigError(f"--http-listen {address!r} must differ from --listen and --registry-addr")
    if not addresses.is_loopback(address) and config.auth_tokens is None and config.tls_client_ca is None:
        raise ConfigError(
            f"--http-listen {address!r} is not a loopback address: set --auth-tokens (or --tls-client-ca), "
            "or bind a loopback address such as 127.0.0.1:8080 (docs/http.md)"
        )


def add_harness_arguments(parser: argparse.ArgumentParser) -> None:
    """``--harness NAME=ADDRESS`` (repeatable), shared by ``serve`` and ``replay``."""
    env = ENV_PREFIX
    parser.add_argument(
        "--harness",
        action="append",
        metavar="NAME=ADDRESS",
        help="remote harness, repeatable; ADDRESS is host:port, dns:///host:port, dns://resolver/host:port, "
        f"unix:path or unix:///abs/path (env {env}HARNESS, comma-separated)",
    )
    parser.add_argument(
        "--harness-process",
        action="append",
        metavar="NAME=MODULE:ATTR",
        help="harness process the host starts (agentsessions-harness serve MODULE:ATTR), restarts after "
        f"a crash and stops on shutdown, repeatable (env {env}HARNESS_PROCESS, comma-separated)",
    )
    parser.add_argument(
        "--harness-describe-max-age",
        metavar="SECONDS",
        help="how long a remote harness's descriptor serves admissions while its connection lasts; "
        f"0 Describes at every admission (env {env}HARNESS_DESCRIBE_MAX_AGE; "
        f"default {DEFAULT_DESCRIBE_MAX_AGE_SECONDS:g})",
    )
    parser.add_argument(
        "--harness-tls-ca",
        metavar="PEM",
        help=f"dial --harness and registered harnesses over TLS, verified by this CA "
        f"(env {env}HARNESS_TLS_CA)",
    )
    parser.add_argument(
        "--harness-tls-cert",
        metavar="PEM",
        help=f"the host's client certificate for mutual TLS to harnesses (env {env}HARNESS_TLS_CERT)",
    )
    parser.add_argument(
        "--harness-tls-key",
        metavar="PEM",
        help=f"the private key of --harness-tls-cert (env {env}HARNESS_TLS_KEY)",
    )


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model provider flags, shared by ``serve`` and ``replay``."""
    env = ENV_PREFIX
    parser.add_argument(
        "--model", metavar="ID", help=f"model id; empty means the built-in echo model (env {env}MODEL)"
    )
    parser.add_argument(
        "--model-base-url",
        metavar="URL",
        help=f"OpenAI-compatible base URL (env {env}MODEL_BASE_URL; default {DEFAULT_MODEL_BASE_URL})",
    )
    parser.add_argument(
        "--model-path",
        metavar="PATH",
        help=f"completions path under the base URL (env {env}MODEL_PATH; default {DEFAULT_MODEL_PATH})",
    )
    parser.add_argument(
        "--model-auth-header",
        metavar="HEADER",
        help=f"header carrying the key from ${openai.KEY_ENV_VARS[0]}; "
        f"Authorization sends 'Bearer <key>' "
        f"(env {env}MODEL_AUTH_HEADER; default {DEFAULT_MODEL_AUTH_HEADER})",
    )
    add_model_transport_arguments(parser)


def check_auth_tokens(path: str) -> None:
    """Load the token file once so a bad file stops startup with a message naming it."""
    try:
        load_principals(path)
    except AuthFileError as exc:
        raise ConfigError(f"--auth-tokens {exc}") from None


def check_authenticated_listener(
    listen: str, auth_tokens: str | None, tls_client_ca: str | None, insecure: bool
) -> None:
    """A listener others can reach authenticates its callers (tokens or mutual TLS), unless the
    operator says, explicitly, that it must not."""
    if addresses.is_loopback(listen) or auth_tokens is not None or tls_client_ca is not None or insecure:
        return
    raise ConfigError(
        f"--listen {listen} is not a loopback address and no authentication is set: anyone who "
        "reaches it could read, run and approve every session. Set --auth-tokens (or mutual TLS "
        "with --tls-client-ca), bind a loopback address, or pass --insecure-allow-unauthenticated "
        "to serve it anyway (docs/security.md)"
    )


def check_approval_policy(path: str) -> None:
    """Load the policy once so a bad file stops startup with a message naming it."""
    try:
        ApprovalPolicy.from_file(path)
    except ApprovalPolicyError as exc:
        raise ConfigError(f"--approval-policy {exc}") from None


def journal_kind(location: str) -> JournalKind:
    """Which store ``--journal`` names; the journal's own parser decides (one reading everywhere)."""
    try:
        return parse_location(location).kind
    except JournalLocationError as exc:
        raise ConfigError(f"--journal: {exc}") from None


def parse_harness_entry(entry: str) -> tuple[str, str]:
    name, sep, address = entry.partition("=")
    if not sep:
        raise ConfigError(f"--harness {entry!r} must be NAME=ADDRESS")
    return name.strip(), address.strip()


def check_harness_name(name: str, flag: str = "--harness") -> None:
    if len(name) > 63 or not _DNS_LABEL.fullmatch(name):
        raise ConfigError(
            f"{flag} name {name!r} must be a DNS label: lowercase letters, digits and '-', "
            "starting and ending alphanumeric, at most 63 characters"
        )
    if name in RESERVED_HARNESS_NAMES:
        raise ConfigError(f"{flag} name {name!r} is reserved for a harness the host serves itself")


def parse_harness_process_entry(entry: str) -> tuple[str, str]:
    name, sep, target = entry.partition("=")
    if not sep:
        raise ConfigError(f"--harness-process {entry!r} must be NAME=MODULE:ATTR")
    return name.strip(), target.strip()


def check_harness_target(name: str, target: str) -> None:
    """A harness process target is ``module:attribute`` (importable by the harness process)."""
    if not _HARNESS_TARGET.fullmatch(target):
        raise ConfigError(
            f"--harness-process {name} target {target!r} must be MODULE:ATTR, dotted Python names "
            "such as agentsessions.harnesses.echo:EchoHarness"
        )


def check_harness_address(flag: str, address: str) -> None:
    """The harness address rules (agentsessions.host.addresses), named after ``flag``."""
    try:
        addresses.check_harness_address(address)
    except AddressError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def check_listen_address(flag: str, address: str) -> None:
    try:
        addresses.check_listen_address(address)
    except AddressError as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def check_registry_address(address: str, listen: str) -> None:
    """The registry is an unauthenticated admin API: a literal loopback IP:port, never the Sessions port."""
    rule = "expected a literal loopback IP:port such as 127.0.0.1:50052"
    try:
        host, port = addresses.split_host_port(address)
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise AddressError(f"{host!r} is not a literal IP") from None
        if not ip.is_loopback:
            raise AddressError("it is not a loopback address")
        addresses.check_port(port)
    except AddressError as exc:
        raise ConfigError(f"--registry-addr {address!r}: {exc}; {rule}") from None
    if address == listen:
        raise ConfigError(f"--registry-addr {address!r} must differ from --listen")


# -- the model provider's timeouts and retries (agentsessions.host.models.transport) -------------

# (flag, attribute, default, integer?) of each setting; the variable is AGENTSESSIONS_<ATTRIBUTE>.
_MODEL_TRANSPORT_FLAGS: tuple[tuple[str, str, float, bool, str], ...] = (
    ("--model-connect-timeout", "model_connect_timeout", 10.0, False, "connecting to the model endpoint"),
    ("--model-read-timeout", "model_read_timeout", 120.0, False, "each read of a model answer"),
    ("--model-timeout", "model_timeout", 300.0, False, "a whole completion, retries and waits included"),
    ("--model-max-attempts", "model_max_attempts", 4, True, "requests per completion (1: never retry)"),
)


class ModelProviderOptions(TypedDict):
    """Keyword arguments of ``OpenAIModel`` from :class:`ModelTransportConfig`."""

    connect_timeout: float
    read_timeout: float
    timeout: float
    retry: RetryPolicy


@struct(frozen=True)
class ModelTransportConfig:
    """How long the OpenAI-compatible provider waits, and how often it retries a 429, 5xx or
    connection error (with backoff and jitter, honouring Retry-After)."""

    connect_timeout: float = 10.0
    read_timeout: float = 120.0
    timeout: float = 300.0
    max_attempts: int = 4

    def __post_init__(self) -> None:
        _check_positive_seconds(
            ("--model-connect-timeout", self.connect_timeout),
            ("--model-read-timeout", self.read_timeout),
            ("--model-timeout", self.timeout),
        )
        if self.max_attempts < 1:
            raise ConfigError(f"--model-max-attempts {self.max_attempts} must be at least 1")

    @classmethod
    def from_sources(cls, args: argparse.Namespace, environ: Mapping[str, str]) -> ModelTransportConfig:
        values: dict[str, float | int] = {}
        for flag, attr, default, integer, _ in _MODEL_TRANSPORT_FLAGS:
            text = _setting(args, environ, attr, str(default))
            try:
                values[attr] = int(text) if integer else float(text)
            except ValueError:
                kind = "an integer" if integer else "a number of seconds"
                raise ConfigError(f"{flag} {text!r} is not {kind}") from None
        return cls(
            connect_timeout=values["model_connect_timeout"],
            read_timeout=values["model_read_timeout"],
            timeout=values["model_timeout"],
            max_attempts=int(values["model_max_attempts"]),
        )

    def provider_options(self) -> ModelProviderOptions:
        return ModelProviderOptions(
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            timeout=self.timeout,
            retry=RetryPolicy(max_attempts=self.max_attempts),
        )


def add_model_transport_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, attr, default, _, what in _MODEL_TRANSPORT_FLAGS:
        unit = "" if attr == "model_max_attempts" else " s"
        parser.add_argument(
            flag,
            metavar="N" if attr == "model_max_attempts" else "SECONDS",
            help=f"bound on {what} (env {ENV_PREFIX}{attr.upper()}; default {default:g}{unit})",
        )
