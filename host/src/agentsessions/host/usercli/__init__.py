"""The user CLI: drive a running host from the ``agentsessions`` command.

    agentsessions create --harness echo          # prints the new session's uid
    agentsessions exec -s UID hi                 # streams the turn as it happens
    agentsessions approve UID                    # decides the pending approval, then continues the turn
    agentsessions log UID                        # the stored records (Sessions.Replay)
    agentsessions watch UID                      # follow it live (LiveSessions.Watch)
    agentsessions verify UID                     # recomputes the hash chain over the wire

Every command takes ``--server`` (``AGENTSESSIONS_SERVER``), TLS and token options
(:mod:`.connection`), and ``--json`` for scripts; exit codes are in :mod:`.errors`.

Names: the wire replay is ``log`` because ``agentsessions replay --journal`` is the offline
controller replay (``agentsessions.host.replay_cli``), which re-runs the harness against a journal file.

``watch`` follows a session live (LiveSessions.Watch): each streamed record goes to
``render.TurnView.record``, as ``log --turns`` does for stored ones.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import grpc

from agentsessions.host.usercli import commands, health
from agentsessions.host.usercli.commands import Call
from agentsessions.host.usercli.connection import Connection, add_connection_arguments, environment
from agentsessions.host.usercli.errors import CommandFailed, UsageError, report

__all__ = ["add_parser"]

Command = Callable[[Call], Coroutine[Any, Any, int]]
EXIT_INTERRUPTED = 130

# argparse's subparsers action has no public, subscriptable type.
_Subparsers = Any


def _runner(name: str, command: Command) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            connection = Connection.from_args(args, environment())
            return asyncio.run(_call(command, args, connection))
        except (grpc.aio.AioRpcError, UsageError, CommandFailed) as exc:
            return report(name, exc, as_json=args.json)
        except KeyboardInterrupt:
            print(f"agentsessions {name}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED

    return run


async def _call(command: Command, args: argparse.Namespace, connection: Connection) -> int:
    async with connection.sessions() as client:
        return await command(Call(args, connection, client, sys.stdout, sys.stderr))


def _command(
    sub: _Subparsers, name: str, command: Command, help: str, *, session: str | None = "the session uid"
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help, description=help)
    if session is not None:
        parser.add_argument("session", metavar="UID", help=session)
    parser.add_argument("--json", action="store_true", help="print proto3 JSON, one message per line")
    add_connection_arguments(parser)
    parser.set_defaults(func=_runner(name, command))
    return parser


def add_parser(sub: _Subparsers) -> None:
    """Register the client commands and ``health`` on the ``agentsessions`` parser."""
    p = _command(sub, "create", commands.create, "create a session; prints its uid", session=None)
    p.add_argument("--harness", default="", help="harness to run on (default: the host's default)")
    p.add_argument("--name", default="", help="display name")
    p.add_argument("--project", default="", help="project (default: the host's)")
    p.add_argument("--model", default="", help="preferred model (metadata)")
    p.add_argument("--label", action="append", metavar="KEY=VALUE", help="a label, repeatable")
    p.add_argument("--annotation", action="append", metavar="KEY=VALUE", help="an annotation, repeatable")

    p = _command(sub, "list", commands.list_sessions, "list a project's sessions, newest first", session=None)
    p.add_argument("--project", default="", help="project (default: the host's)")
    p.add_argument("--page-size", type=int, default=0, help="sessions per request (default: the host's)")
    p.add_argument("--limit", type=int, help="stop after this many sessions")

    _command(sub, "get", commands.get, "show a session with its derived state")

    p = _command(
        sub,
        "exec",
        commands.exec_turn,
        "run a turn and stream it: output as it is generated, tool calls, approvals",
        session=None,
    )
    p.add_argument("text", nargs="*", metavar="TEXT", help="the turn's input ('-' reads stdin)")
    p.add_argument("--session", "-s", default="", metavar="UID", help="session to run (default: a new one)")
    p.add_argument("--harness", default="", help="harness for a new session, or a per-turn override")
    p.add_argument("--config", help="harness configuration for this turn (for example JSON)")
    p.add_argument("--config-file", metavar="FILE", help="read the configuration from FILE")
    p.add_argument(
        "--expected-last-seq", type=int, metavar="SEQ", help="refuse (ABORTED) unless the journal head is SEQ"
    )
    p.add_argument("--deadline", type=float, metavar="SECONDS", help="abandon the turn after SECONDS")
    p.add_argument("--verbose", "-v", action="store_true", help="also print every record as it is journaled")

    for name, approved in (("approve", True), ("deny", False)):
        verb = "approve" if approved else "deny"
        p = _command(
            sub,
            name,
            _decider(approved),
            f"{verb} the session's pending tool call, then continue the turn",
        )
        p.add_argument("--reason", default="", help="justification, journaled with the decision")
        p.add_argument("--actor", default="", metavar="PRINCIPAL", help="who decides (journaled)")
        p.add_argument("--issuer", default="", help="the actor's issuer")
        p.add_argument("--subject", default="", help="the actor's subject")
        p.add_argument("--execution", metavar="ID", help="name the gate instead of the pending one")
        p.add_argument("--tool-call", metavar="ID", help="the gated call (with --execution)")
        p.add_argument("--request-seq", type=int, metavar="SEQ", help="its APPROVAL_REQUEST seq")
        p.add_argument(
            "--no-continue", action="store_true", help="only record the decision (resume delivers it later)"
        )
        p.add_argument("--verbose", "-v", action="store_true", help="also print every record")

    p = _command(sub, "fork", commands.fork, "fork a session into children; prints their uids")
    p.add_argument("--at", type=int, default=0, metavar="SEQ", help="last parent seq to copy (default: head)")
    p.add_argument("--count", type=int, help="number of children (default: 1, or one per --child-name)")
    p.add_argument("--child-name", action="append", metavar="NAME", help="a child's name, repeatable")
    p.add_argument("--label", action="append", metavar="KEY=VALUE", help="a label for every child")

    _command(sub, "suspend", commands.suspend, "checkpoint and release a session's compute")
    _command(sub, "resume", commands.resume, "restore a session and complete an interrupted turn")
    p = _command(sub, "cancel", commands.cancel, "cancel a session's running turn")
    p.add_argument("--execution", default="", metavar="ID", help="the execution (default: the running one)")
    p.add_argument("--reason", default="", help="why, journaled")
    _command(sub, "delete", commands.delete, "delete a session")

    p = _command(
        sub, "watch", commands.watch, "follow a session live: records, streamed output, state changes"
    )
    p.add_argument("--after", type=int, default=0, metavar="SEQ", help="start after this seq (default: 0)")
    p.add_argument("--no-follow", action="store_true", help="print the stored records and stop")
    p.add_argument("--no-deltas", action="store_true", help="print model output when it is journaled only")
    p.add_argument("--verbose", "-v", action="store_true", help="also print every record as it is journaled")

    p = _command(sub, "log", commands.log, "print a session's stored records (Sessions.Replay)")
    p.add_argument("--from", dest="from_seq", type=int, default=0, metavar="SEQ", help="first seq")
    p.add_argument("--to", type=int, default=0, metavar="SEQ", help="last seq (default: the head)")
    p.add_argument("--turns", action="store_true", help="render as a conversation, as exec prints it")

    p = sub.add_parser(
        "verify",
        help="recompute sessions' hash chains over the wire",
        description="Replay each session and recompute every record's hash from genesis.",
    )
    p.add_argument("session", nargs="+", metavar="UID", help="the sessions to verify")
    p.add_argument("--json", action="store_true", help="print one JSON object per session")
    add_connection_arguments(p)
    p.set_defaults(func=_runner("verify", commands.verify))

    health.add_parser(sub)


def _decider(approved: bool) -> Command:
    async def decide(call: Call) -> int:
        return await commands.decide(call, approved=approved)

    return decide
