"""``agentsessions replay``: re-run a session's completed executions against its journal.

Controller replay (spec 4.3) is how an operator checks that a journal still drives its harness:
every completed execution runs again, in order, with the harness asking for what it asked for
live; model calls are answered from the journal (none reaches the provider, I1), outputs and tool
calls are checked against the records, and nothing is written. The journal, harnesses and model
are built exactly as ``serve`` builds them, from the same flags and ``AGENTSESSIONS_*`` variables.

Exit status: 0 the session replays; 1 it does not (a divergence, named on stderr, or a hash chain
that does not verify); 2 it could not be replayed (bad flags, no such journal or session, a harness
that is unreachable or not the one the journal recorded).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from agentsessions.host import config as host_config
from agentsessions.host.app import App, build_controller
from agentsessions.host.config import ConfigError, HostConfig
from agentsessions.host.controller.errors import ControllerError, ReplayDivergedError
from agentsessions.host.controller.replay import ReplayReport
from agentsessions.host.journal import redact_url
from agentsessions.host.journal.store import StoreError, TamperedError
from agentsessions.host.progress import progress
from agentsessions.host.runtime.process import HarnessProcessError

__all__ = ["EXIT_BAD_INPUT", "EXIT_DIVERGED", "EXIT_OK", "add_parser"]

EXIT_OK: Final = 0
EXIT_DIVERGED: Final = 1
EXIT_BAD_INPUT: Final = 2

_SQLITE_SCHEME: Final = "sqlite://"


class _CannotReplay(Exception):
    """The replay could not run at all (exit 2)."""


def add_parser(subparsers: Any) -> None:
    """Register ``replay`` on the ``agentsessions`` parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "replay",
        help="re-run a session's completed executions against its journal (zero model calls)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--journal",
        required=True,
        metavar="LOCATION",
        help="SQLite journal file (path or sqlite:///path) or postgres:// URL",
    )
    parser.add_argument("--session", required=True, metavar="UID", help="the session to replay")
    host_config.add_harness_arguments(parser)
    host_config.add_model_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        config = replay_config(args, os.environ)
        return asyncio.run(_replay(config, args.session))
    except (ConfigError, _CannotReplay, HarnessProcessError) as exc:
        _error(str(exc))
    except KeyboardInterrupt:
        _error("interrupted")
    return EXIT_BAD_INPUT


def replay_config(args: argparse.Namespace, environ: Mapping[str, str]) -> HostConfig:
    """The host configuration ``serve`` would build from these flags, minus host-run tools:
    a replay never executes a tool, so no executor or MCP server is started for it."""
    journal: str = args.journal
    if journal.startswith(_SQLITE_SCHEME):
        journal = journal[len(_SQLITE_SCHEME) :]
    if journal == "memory:":
        raise ConfigError("--journal memory: holds no sessions of another process; name a file or URL")
    config = HostConfig.from_sources(argparse.Namespace(**{**vars(args), "journal": journal}), environ)
    if config.journal_kind == "sqlite" and not Path(config.journal).is_file():
        raise ConfigError(f"--journal {config.journal}: no such file")
    return dataclasses.replace(config, tool_executors=[], mcp_servers=[], tools_files=[])


async def _replay(config: HostConfig, uid: str) -> int:
    shown = redact_url(config.journal) if config.journal_kind == "postgres" else config.journal
    app = App(services=[])
    try:
        controller = await build_controller(config, app)
        if await controller.store.get_session(uid) is None:
            raise _CannotReplay(f"no session {uid} in journal {shown}")
        with progress(f"verifying {uid}", unit="") as bar:
            verified = await controller.store.verify(uid)
            bar.update(description=f"replaying {verified} records of {uid}")
            report = await controller.replay(uid)
    except TamperedError as exc:
        print(f"FAILED: session {exc.session} seq {exc.seq}: {exc.why}", file=sys.stderr)
        return EXIT_DIVERGED
    except ReplayDivergedError as exc:
        print(f"DIVERGED: session {uid}: {exc}", file=sys.stderr)
        return EXIT_DIVERGED
    except (ControllerError, StoreError) as exc:
        raise _CannotReplay(f"session {uid}: {exc}") from exc
    finally:
        await app.close()
    if report.model_calls:
        print(f"DIVERGED: session {uid}: replay made {report.model_calls} model calls (I1)", file=sys.stderr)
        return EXIT_DIVERGED
    _print_report(uid, verified, report)
    return EXIT_OK


def _print_report(uid: str, verified: int, report: ReplayReport) -> None:
    print(
        f"ok: session {uid} replays: {report.executions} executions, {len(report.outputs)} outputs; "
        f"{report.served_model_calls} model calls served from the journal, {report.model_calls} sent to "
        f"the provider; {verified} records verified, nothing written"
    )
    for i, text in enumerate(report.outputs, start=1):
        print(f"  output {i}: {json.dumps(text, ensure_ascii=False)}")


def _error(message: str) -> None:
    print(f"agentsessions replay: error: {message}", file=sys.stderr)
