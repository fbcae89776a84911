"""The ``agentsessions`` command: serve the host, journal tooling, controller replay, and the client
commands that drive a running host (create, exec, approve, ...; see ``agentsessions.host.usercli``).

Each subcommand lives with the code it drives and registers itself here through an
``add_parser(subparsers)`` function that sets ``func`` (returning an exit code).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentsessions", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    from agentsessions.host import replay_cli, server, usercli
    from agentsessions.host.journal import cli as journal_cli

    server.add_parser(sub)
    journal_cli.add_parser(sub)
    replay_cli.add_parser(sub)
    usercli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
