"""Authentication and per-method roles: the host's auth server interceptor (``--auth-tokens``).

Every call except health and reflection must come from a principal of the token file: an
``authorization: Bearer <token>`` header (compared in constant time, never logged or echoed), or,
when no header is sent, a client certificate (mutual TLS) whose SAN or ``CN=`` names one. Without
either, or with a token or certificate the file does not know, the call is UNAUTHENTICATED. A
principal without the method's role is PERMISSION_DENIED with the role named; project checks
happen in the controller (``PrincipalAccess``), once the session's project is known: the
interceptor binds the call's :class:`~agentsessions.host.callcontext.CallContext`, and the servicer
hands it to the controller.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import NoReturn

import grpc
from grpc import aio

from agentsessions.host.auth.principals import ADMIN, APPROVER, READER, WRITER, Principal, Principals
from agentsessions.host.callcontext import CallContext, bind
from agentsessions.host.interception import around_handler

SESSIONS = "agentsessions.v1.Sessions"
REGISTRY = "agentsessions.v1.HarnessRegistry"
LIVE = "agentsessions.ext.v1.LiveSessions"
SUBAGENTS = "agentsessions.ext.v1.Subagents"
COMPACTION = "agentsessions.ext.v1.SessionCompaction"

# Reachable without credentials: probes and tooling must work before anyone has a token.
OPEN_SERVICES = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
    }
)

SESSIONS_ROLES: Mapping[str, str] = {
    "GetSession": READER,
    "ListSessions": READER,
    "Replay": READER,
    "CreateSession": WRITER,
    "Exec": WRITER,
    "Suspend": WRITER,
    "Resume": WRITER,
    "Fork": WRITER,
    "Cancel": WRITER,
    "DeleteSession": WRITER,
    "Approve": APPROVER,
}

LIVE_ROLES: Mapping[str, str] = {"Watch": READER, "Submit": WRITER}
SUBAGENT_ROLES: Mapping[str, str] = {"GetSubagents": READER}
COMPACTION_ROLES: Mapping[str, str] = {"Compact": WRITER}

_AUTHORIZATION = "authorization"
_BEARER = "bearer"

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


def required_role(method: str) -> str | None:
    """The role a full method name (``/package.Service/Method``) needs; None for open services.
    Anything this table does not name needs ``admin``."""
    service, _, name = method.lstrip("/").rpartition("/")
    if service in OPEN_SERVICES:
        return None
    if service == SESSIONS:
        return SESSIONS_ROLES.get(name, ADMIN)
    if service == LIVE:
        return LIVE_ROLES.get(name, ADMIN)
    if service == SUBAGENTS:
        return SUBAGENT_ROLES.get(name, ADMIN)
    if service == COMPACTION:
        return COMPACTION_ROLES.get(name, ADMIN)
    return ADMIN


class _Malformed:
    """An authorization header the host refuses, and why."""

    def __init__(self, why: str) -> None:
        self.why = why


_MALFORMED = _Malformed("authorization metadata must be 'Bearer <token>'")
# Which of two tokens would count is a guess an attacker could steer: refuse them both.
_DUPLICATE = _Malformed("more than one authorization header: send exactly one 'Bearer <token>'")


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | _Malformed | None:
    """The token of the one ``authorization: Bearer <token>`` header (None: no header)."""
    headers = [value for key, value in metadata or () if key == _AUTHORIZATION]
    if not headers:
        return None
    if len(headers) > 1:
        return _DUPLICATE
    (value,) = headers
    if not isinstance(value, str):
        return _MALFORMED
    scheme, _, token = value.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != _BEARER or not token:
        return _MALFORMED
    return token


class AuthInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, principals: Principals) -> None:
        self._principals = principals

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        role = required_role(method)
        if handler is None or role is None:
            return handler
        token = bearer_token(handler_call_details.invocation_metadata)
        return around_handler(handler, functools.partial(self._admit, method, role, token))

    @contextlib.asynccontextmanager
    async def _admit(
        self, method: str, role: str, token: str | _Malformed | None, context: aio.ServicerContext
    ) -> AsyncIterator[None]:
        principal = await self._authenticate(token, context)
        if not principal.has_role(role):
            await _abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"principal {principal.principal!r} lacks role {role!r}, needed for {method.lstrip('/')}",
            )
        bind(CallContext(principal, method))
        yield

    async def _authenticate(self, token: str | _Malformed | None, context: aio.ServicerContext) -> Principal:
        if isinstance(token, _Malformed):
            await _abort(context, grpc.StatusCode.UNAUTHENTICATED, token.why)
        if token is not None:
            principal = self._principals.by_token(token)
            if principal is None:
                await _abort(context, grpc.StatusCode.UNAUTHENTICATED, "the bearer token is not recognised")
            return principal
        common_names, sans = _certificate_names(context)
        if not common_names and not sans:
            await _abort(
                context,
                grpc.StatusCode.UNAUTHENTICATED,
                "authentication required: send 'authorization: Bearer <token>' or a client certificate",
            )
        matched = self._principals.by_certificate(common_names, sans)
        if not matched:
            await _abort(
                context, grpc.StatusCode.UNAUTHENTICATED, "the client certificate maps to no principal"
            )
        if len(matched) > 1:
            names = ", ".join(repr(p.principal) for p in matched)
            await _abort(
                context,
                grpc.StatusCode.UNAUTHENTICATED,
                f"the client certificate maps to more than one principal ({names})",
            )
        return matched[0]


def _certificate_names(context: aio.ServicerContext) -> tuple[list[str], list[str]]:
    """The verified peer certificate's common names and SANs (empty without mutual TLS)."""
    properties: Mapping[str, Iterable[bytes]] = context.auth_context() or {}
    if b"ssl" not in properties.get("transport_security_type", ()):
        return [], []
    common_names = [value.decode() for value in properties.get("x509_common_name", ())]
    sans = [value.decode() for value in properties.get("x509_subject_alternative_name", ())]
    return common_names, sans


async def _abort(context: aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("context.abort returned")
