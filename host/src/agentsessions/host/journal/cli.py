"""``agentsessions journal``: journal tooling (placeholder until the journal commands land).

It registers the command group so ``agentsessions`` builds its parser; the journal's owner
replaces this module with the real subcommands.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser("journal", help="journal tooling")
    parser.set_defaults(func=lambda args: _no_subcommand(parser))


def _no_subcommand(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
