"""The ``agentsessions`` command: serve the host, journal tooling, controller replay, and the client
commands that drive a running host (create, exec, approve, ...; see ``agentsessions.host.usercli``).

Each subcommand lives with the code it drives and registers itself here through an
``add_parser(subparsers)`` function that sets ``func`` (returning an exit code). A run imports only
the module of the command it runs (``COMMANDS``); help and unknown commands import them all.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
from collections.abc import Sequence
from typing import Final

from agentsessions.sdk.grpcenv import choose_transport

# The module that registers each command (tests/host/test_cli_commands.py keeps this in step with
# what the modules register).
_SERVER: Final = "agentsessions.host.server"
_JOURNAL: Final = "agentsessions.host.journal.cli"
_REPLAY: Final = "agentsessions.host.replay_cli"
_CLIENT: Final = "agentsessions.host.usercli"
COMMANDS: Final[dict[str, str]] = {
    "serve": _SERVER,
    "journal": _JOURNAL,
    "replay": _REPLAY,
    **dict.fromkeys(
        (
            "create",
            "list",
            "get",
            "exec",
            "approve",
            "deny",
            "fork",
            "suspend",
            "resume",
            "cancel",
            "delete",
            "watch",
            "log",
            "verify",
            "health",
        ),
        _CLIENT,
    ),
}
MODULES: Final = (_SERVER, _JOURNAL, _REPLAY, _CLIENT)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of ``command`` alone (its module only is imported)."""
    parser = argparse.ArgumentParser(prog="agentsessions", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    wanted = COMMANDS.get(command or "")
    for name in MODULES if wanted is None else (wanted,):
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Before any command's module imports grpc: gRPC core reads its transport's setting once.
    choose_transport()
    args = _parsed(list(sys.argv[1:] if argv is None else argv))
    code: int = args.func(args)
    return code


def _parsed(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed, with the collector paused while the command's modules load: they allocate
    ~60,000 objects that live as long as the process, and collecting among them on the way cost
    ~14 ms of a ~180 ms import (bench/README.md, start-up)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return build_parser(argv[0] if argv else None).parse_args(argv)
    finally:
        if collecting:
            gc.enable()


if __name__ == "__main__":
    sys.exit(main())
