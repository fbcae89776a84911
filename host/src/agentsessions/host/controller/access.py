"""The authorization hook: may the caller use this session's project, and who is the actor.

The controller asks its :class:`SessionAccess` before it acts on a session (with the session's
project) and when it journals who acted (CreateSession's identity, Approve's decision actor),
always with the :class:`~agentsessions.host.callcontext.CallContext` of the call it serves, passed
explicitly. It knows nothing about tokens, certificates or gRPC: ``agentsessions.host.auth``
implements the hook from the call's authenticated principal, and refuses a call that has none.
Without authentication the host uses :data:`OPEN_ACCESS`: every project is allowed and a
request's identity is recorded as given.
"""

from __future__ import annotations

from typing import Protocol

from agentsessions.host.callcontext import CallContext
from agentsessions.v1 import common_pb2


class SessionAccess(Protocol):
    def check_caller(self, call: CallContext) -> None:
        """Raise ``UnauthenticatedError`` when the call must carry a principal and does not
        (before anything about a session is looked up for it)."""
        ...

    def check_project(self, call: CallContext, project: str) -> None:
        """Raise ``PermissionDeniedError`` when the caller may not use ``project`` (or
        ``UnauthenticatedError`` when the call has no principal and one is required)."""
        ...

    def actor(
        self, call: CallContext, claimed: common_pb2.IdentityRef | None
    ) -> common_pb2.IdentityRef | None:
        """The identity to journal for a request that claims ``claimed`` (None: claims none);
        raises ``PermissionDeniedError`` when the claim contradicts the authenticated caller."""
        ...


class OpenAccess:
    """No authentication: every project is allowed and identities are provenance as given."""

    def check_caller(self, call: CallContext) -> None:
        return None

    def check_project(self, call: CallContext, project: str) -> None:
        return None

    def actor(
        self, call: CallContext, claimed: common_pb2.IdentityRef | None
    ) -> common_pb2.IdentityRef | None:
        return claimed


OPEN_ACCESS = OpenAccess()
