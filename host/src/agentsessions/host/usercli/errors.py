"""Exit codes of the client commands, and the one place errors become them.

==  =========================================================================================
0   done: the call succeeded; ``exec`` (and ``approve``/``deny``) ended with the turn completed
1   the outcome is a failure: the turn failed or was cancelled, ``verify`` found a broken chain,
    ``health`` found the host not serving
2   usage: bad flags or local input (nothing was sent)
3   the host refused the call: the gRPC status is printed (NOT_FOUND, FAILED_PRECONDITION, ...)
4   no host answered: UNAVAILABLE or DEADLINE_EXCEEDED (wrong ``--server``, host down or draining)
5   the turn parked awaiting an approval: decide with ``approve`` or ``deny``
==  =========================================================================================
"""

from __future__ import annotations

import json
import sys
from typing import Final, TextIO

import grpc

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_REFUSED: Final = 3
EXIT_UNREACHABLE: Final = 4
EXIT_AWAITING: Final = 5

_UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class UsageError(Exception):
    """Bad flags or local input, found before anything is sent (exit 2)."""


class CommandFailed(Exception):
    """The command ran but its outcome is a failure (exit 1); the message says which."""


def exit_code_of(error: grpc.aio.AioRpcError) -> int:
    return EXIT_UNREACHABLE if error.code() in _UNREACHABLE else EXIT_REFUSED


def report(command: str, exc: BaseException, *, as_json: bool, stream: TextIO | None = None) -> int:
    """Print ``exc`` for a person (or as one JSON object with ``--json``) on stderr; its exit code."""
    out = stream or sys.stderr
    if isinstance(exc, grpc.aio.AioRpcError):
        code, name, message = exit_code_of(exc), exc.code().name, exc.details() or ""
    elif isinstance(exc, UsageError):
        code, name, message = EXIT_USAGE, "USAGE", str(exc)
    elif isinstance(exc, CommandFailed):
        code, name, message = EXIT_FAILED, "FAILED", str(exc)
    else:
        raise exc
    if as_json:
        print(json.dumps({"error": {"code": name, "message": message}}, ensure_ascii=False), file=out)
    else:
        shown = f"{name}: {message}" if isinstance(exc, grpc.aio.AioRpcError) else message
        print(f"agentsessions {command}: {shown}", file=out)
    return code
