"""The request id of the RPC being served: taken from ``x-request-id`` metadata or minted.

The access-log interceptor sets it before a handler runs, returns it to the client in trailing
metadata, and every log line written while the handler runs carries it. Handlers read it with
``current()``; a handler that sets its own trailing metadata should include ``metadata()``.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Iterable

from agentsessions.host import ids

HEADER = "x-request-id"

# A caller's id is echoed into logs and trailers, so only short, plain tokens are accepted.
_ACCEPTABLE = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")

_current: contextvars.ContextVar[str] = contextvars.ContextVar("agentsessions_request_id", default="")


def current() -> str:
    """The id of the RPC this code runs under, or "" outside an RPC."""
    return _current.get()


def bind(request_id: str) -> contextvars.Token[str]:
    """Make ``request_id`` current for the running task (and the tasks it creates)."""
    return _current.set(request_id)


def mint() -> str:
    return ids.token_hex(16)


def from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The caller's acceptable ``x-request-id``, else a fresh one."""
    for key, value in metadata or ():
        if key == HEADER and isinstance(value, str) and _ACCEPTABLE.fullmatch(value):
            return value
    return mint()


def metadata() -> tuple[tuple[str, str], ...]:
    """The current id as a metadata pair, for handlers that set their own trailing metadata."""
    request_id = current()
    return ((HEADER, request_id),) if request_id else ()
