"""The authenticated principal of the call being served, and the controller's access hook on it.

The auth interceptor binds the principal in the call's task (the handler and the tasks it starts
see it). :class:`PrincipalAccess` is the controller's ``SessionAccess`` under authentication: a
principal uses only its projects, and the identity journaled for it is its own.
"""

from __future__ import annotations

import contextvars

from agentsessions.host.auth.principals import Principal
from agentsessions.host.controller.errors import PermissionDeniedError
from agentsessions.v1 import common_pb2

_current: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "agentsessions_principal", default=None
)


def current() -> Principal | None:
    """The principal of the call this code runs under; None outside an authenticated call."""
    return _current.get()


def bind(principal: Principal) -> None:
    """Make ``principal`` current for the running task (each RPC has its own, so it is not reset)."""
    _current.set(principal)


class PrincipalAccess:
    """``SessionAccess`` from the current principal. Work with no principal bound is the host's
    own (it started no RPC of a caller), and is not restricted."""

    enforced = True

    def check_project(self, project: str) -> None:
        principal = current()
        if principal is not None and not principal.may_use(project):
            raise PermissionDeniedError(f"principal {principal.principal!r} may not use project {project!r}")

    def actor(self, claimed: common_pb2.IdentityRef | None) -> common_pb2.IdentityRef | None:
        """The authenticated identity. A claimed identity is accepted only where it agrees: each
        field it sets must equal the authenticated one (fields it leaves empty are not claims)."""
        principal = current()
        if principal is None:
            return claimed
        own = principal.identity()
        if claimed is not None:
            for name in ("principal", "issuer", "subject"):
                value = getattr(claimed, name)
                if value and value != getattr(own, name):
                    raise PermissionDeniedError(
                        f"identity.{name} {value!r} is not the authenticated caller's "
                        f"({getattr(own, name)!r}): the actor is always the authenticated principal"
                    )
        return own
