"""The host's limits: how big a request or a record may be, and how many executions run at once.

Each limit is a ``serve`` flag (and its ``AGENTSESSIONS_*`` variable) with a default that keeps
every answer readable by a client on gRPC's default 4 MiB message size:

* ``--max-identity-bytes``: each of an identity's principal, issuer and subject (UTF-8 bytes);
* ``--max-input-bytes``: an Exec's inputs together (encoded size);
* ``--max-record-bytes``: one journal record's event (encoded size), whoever produced it: a
  harness frame, a model answer or a tool result over it fails the turn with RESOURCE_EXHAUSTED
  and an ERROR record, and nothing a default client cannot read back is ever journaled;
* ``--max-executions`` / ``--max-project-executions``: turns driven at once on this host, in all
  and per project; one more is refused with RESOURCE_EXHAUSTED before anything is written;
* ``--max-read-loop-percent``: the share of the event loop's time the calls streaming journal
  records (Replay, Watch) may take, all callers together, while executions run and the loop is
  congested (``controller/pacing.py``); 0 never paces;
* ``--max-listed-sessions-per-s``: sessions ListSessions pages hold, all callers together, under
  the same conditions; 0 never paces.

Request limits answer INVALID_ARGUMENT naming the field and the flag; capacity limits answer
RESOURCE_EXHAUSTED naming the flag (docs/errors.md).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import field
from typing import Final

from agentsessions.host.controller.errors import ResourceExhaustedError
from agentsessions.host.journal.store import KEPT_LISTED
from agentsessions.sdk.structs import struct

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_READABLE_BYTES",
    "ExecutionSlots",
    "Limits",
    "LimitsError",
    "add_arguments",
]

# What a client on gRPC's default receive limit reads in one message, less room for the envelope
# around a record (ExecUpdate, LogRecord: seq, hashes, fence) or around a page of sessions.
CLIENT_DEFAULT_BYTES: Final = 4 * 1024 * 1024
ENVELOPE_BYTES: Final = 64 * 1024
MAX_READABLE_BYTES: Final = CLIENT_DEFAULT_BYTES - ENVELOPE_BYTES

_ENV_PREFIX: Final = "AGENTSESSIONS_"


class LimitsError(ValueError):
    """A limit's value breaks a rule; the message names the flag."""


@struct(frozen=True)
class _Flag:
    flag: str
    attr: str
    what: str

    @property
    def default(self) -> int:
        """The limit's default: the :class:`Limits` field's, so the two never disagree."""
        value: int = getattr(Limits, self.attr)
        return value


_FLAGS: Final = (
    _Flag("--max-identity-bytes", "max_identity_bytes", "each identity field (principal, issuer, subject)"),
    _Flag("--max-input-bytes", "max_input_bytes", "an Exec's inputs together"),
    _Flag("--max-record-bytes", "max_record_bytes", "one journal record"),
    _Flag("--max-executions", "max_executions", "executions running at once on this host"),
    _Flag("--max-project-executions", "max_project_executions", "executions running at once per project"),
    _Flag(
        "--max-read-loop-percent",
        "max_read_loop_percent",
        "percent of the event loop's time Replay and Watch may take while turns load the host (0: no limit)",
    ),
    _Flag(
        "--max-listed-sessions-per-s",
        "max_listed_sessions_per_s",
        "sessions listed by ListSessions per second while turns load the host (0: no limit)",
    ),
    _Flag(
        "--max-kept-listed-sessions",
        "max_kept_listed_sessions",
        "listed sessions kept decoded and encoded for the next ListSessions page, ~1.2 KiB each "
        "(0: keep none)",
    ),
)
# Limits that may be 0 (switched off).
_MAY_BE_ZERO: Final = frozenset(
    {"max_read_loop_percent", "max_listed_sessions_per_s", "max_kept_listed_sessions"}
)
# Flags a host no longer takes, and what replaced each: one still given (flag or variable) is refused
# at start-up with that answer, not ignored.
_RETIRED: Final = {
    "max_read_records_per_s": "--max-read-records-per-s was replaced by --max-read-loop-percent "
    "(the share of the event loop's time Replay and Watch may take while turns load the host; "
    "default 2)",
}


@struct(frozen=True)
class Limits:
    """The limits one host enforces (see the module docstring); the flags' defaults are these."""

    max_identity_bytes: int = 1024
    max_input_bytes: int = 1024 * 1024
    max_record_bytes: int = MAX_READABLE_BYTES
    max_executions: int = 512
    max_project_executions: int = 256
    # Of the loop's time the readers' own steps take (live delivery to watchers not counted); gRPC's
    # completion work for the messages they write runs outside those steps and is not counted, so
    # their real share is a few times this (bench/NOTEBOOK.md): 1 keeps 20 replayers, 20 listers and
    # 20 watchers within 20% of a saturated host's turns, every replay within a minute.
    max_read_loop_percent: int = 1
    max_listed_sessions_per_s: int = 10_000
    max_kept_listed_sessions: int = KEPT_LISTED

    def __post_init__(self) -> None:
        for spec in _FLAGS:
            value = getattr(self, spec.attr)
            if spec.attr in _MAY_BE_ZERO:
                if value < 0:
                    raise LimitsError(f"{spec.flag} {value} must be at least 0 (0: no limit)")
            elif value < 1:
                raise LimitsError(f"{spec.flag} {value} must be at least 1")
        if self.max_record_bytes > MAX_READABLE_BYTES:
            raise LimitsError(
                f"--max-record-bytes {self.max_record_bytes} must be at most {MAX_READABLE_BYTES}: "
                "a client on gRPC's default 4 MiB limit could not read a larger record back"
            )
        if self.max_input_bytes > self.max_record_bytes:
            raise LimitsError(
                f"--max-input-bytes {self.max_input_bytes} must not exceed --max-record-bytes "
                f"{self.max_record_bytes}: each input is journaled as one record"
            )
        if self.max_project_executions > self.max_executions:
            raise LimitsError(
                f"--max-project-executions {self.max_project_executions} must not exceed "
                f"--max-executions {self.max_executions}"
            )
        if self.max_read_loop_percent > 100:
            raise LimitsError(f"--max-read-loop-percent {self.max_read_loop_percent} must be at most 100")

    @classmethod
    def from_sources(cls, args: argparse.Namespace, environ: Mapping[str, str]) -> Limits:
        """Each limit from its flag, else ``AGENTSESSIONS_<NAME>``, else the default."""
        for attr, replaced in _RETIRED.items():
            if getattr(args, attr, None) is not None or _ENV_PREFIX + attr.upper() in environ:
                raise LimitsError(replaced)
        values: dict[str, int] = {}
        for spec in _FLAGS:
            given: str | None = getattr(args, spec.attr, None)
            text = (
                given
                if given is not None
                else environ.get(_ENV_PREFIX + spec.attr.upper(), str(spec.default))
            )
            try:
                values[spec.attr] = int(text)
            except ValueError:
                raise LimitsError(f"{spec.flag} {text!r} is not an integer") from None
        return cls(**values)


DEFAULT_LIMITS: Final = Limits()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The limit flags of ``serve``."""
    for spec in _FLAGS:
        unit = " bytes" if spec.attr.endswith("_bytes") else ""
        parser.add_argument(
            spec.flag,
            metavar="N",
            help=f"at most N{unit} for {spec.what} (env {_ENV_PREFIX}{spec.attr.upper()}; "
            f"default {spec.default})",
        )
    for attr in _RETIRED:  # taken only to answer with what replaced it
        parser.add_argument("--" + attr.replace("_", "-"), dest=attr, help=argparse.SUPPRESS)


@struct
class ExecutionSlots:
    """Executions running on this host, in all and per project, bounded by the limits."""

    limits: Limits = DEFAULT_LIMITS
    running: int = 0
    by_project: dict[str, int] = field(default_factory=dict)

    @contextlib.contextmanager
    def hold(self, project: str) -> Iterator[None]:
        """Take one slot for ``project`` while the block runs; ResourceExhaustedError at once
        when the host or the project is at its limit (nothing waits)."""
        if self.running >= self.limits.max_executions:
            raise ResourceExhaustedError(
                f"{self.running} executions are running on this host, the limit "
                f"(--max-executions {self.limits.max_executions}); retry when one ends"
            )
        mine = self.by_project.get(project, 0)
        if mine >= self.limits.max_project_executions:
            raise ResourceExhaustedError(
                f"{mine} executions of project {project!r} are running on this host, the limit "
                f"(--max-project-executions {self.limits.max_project_executions}); retry when one ends"
            )
        self.running += 1
        self.by_project[project] = mine + 1
        try:
            yield
        finally:
            self.running -= 1
            left = self.by_project[project] - 1
            if left:
                self.by_project[project] = left
            else:
                del self.by_project[project]
