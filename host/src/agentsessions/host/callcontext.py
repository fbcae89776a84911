"""Who a call comes from: the context an RPC carries from the server interceptors to the controller.

The auth interceptor (``agentsessions.host.auth``) binds the :class:`CallContext` of the call it
authenticated in the call's own task; the servicers read it once per call with :func:`current` and
hand it to every controller method explicitly, so the controller's access checks see the caller as
an argument, never as ambient state. Nothing bound means :data:`ANONYMOUS`: no principal, which an
authenticating host refuses (fail closed), and an open host (no ``--auth-tokens``) accepts.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

from agentsessions.sdk.structs import struct

if TYPE_CHECKING:  # the auth package imports this module: no import cycle at run time
    from agentsessions.host.auth.principals import Principal


@struct(frozen=True)
class CallContext:
    """The caller of one RPC: its authenticated principal (None: nobody authenticated it)."""

    principal: Principal | None = None
    method: str = ""
    # The request's ``idempotency-key`` metadata ("" without one): a retry with it does the work once.
    idempotency_key: str = ""


ANONYMOUS = CallContext()

_current: contextvars.ContextVar[CallContext] = contextvars.ContextVar(
    "agentsessions_call_context", default=ANONYMOUS
)


def bind(call: CallContext) -> None:
    """Make ``call`` the context of the running RPC task (each RPC has its own, so it is not reset)."""
    _current.set(call)


def current() -> CallContext:
    """The context bound for the RPC this code serves; ANONYMOUS when none was bound."""
    return _current.get()
