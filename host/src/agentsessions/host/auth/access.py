"""The controller's access hook under authentication: :class:`PrincipalAccess`.

A principal uses only its projects, and the identity journaled for it is its own. The principal
comes from the call context the servicer hands the controller (bound by the auth interceptor for
the call it authenticated); a call without one is refused, so a code path that forgets to carry
the caller is never trusted by default.
"""

from __future__ import annotations

from agentsessions.host.auth.principals import Principal
from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller.errors import PermissionDeniedError, UnauthenticatedError
from agentsessions.v1 import common_pb2


class PrincipalAccess:
    """``SessionAccess`` from the call's authenticated principal; no principal, no access."""

    def check_caller(self, call: CallContext) -> None:
        _authenticated(call)

    def check_project(self, call: CallContext, project: str) -> None:
        principal = _authenticated(call)
        if not principal.may_use(project):
            raise PermissionDeniedError(f"principal {principal.principal!r} may not use project {project!r}")

    def actor(
        self, call: CallContext, claimed: common_pb2.IdentityRef | None
    ) -> common_pb2.IdentityRef | None:
        """The authenticated identity. A claimed identity is accepted only where it agrees: each
        field it sets must equal the authenticated one (fields it leaves empty are not claims)."""
        own = _authenticated(call).identity()
        if claimed is not None:
            for name in ("principal", "issuer", "subject"):
                value = getattr(claimed, name)
                if value and value != getattr(own, name):
                    raise PermissionDeniedError(
                        f"identity.{name} {value!r} is not the authenticated caller's "
                        f"({getattr(own, name)!r}): the actor is always the authenticated principal"
                    )
        return own


def _authenticated(call: CallContext) -> Principal:
    if call.principal is None:
        where = f" for {call.method.lstrip('/')}" if call.method else ""
        raise UnauthenticatedError(f"no authenticated principal{where}: this host requires authentication")
    return call.principal
