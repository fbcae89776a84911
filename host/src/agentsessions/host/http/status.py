"""The one table from gRPC status codes to HTTP status codes, and the JSON error body.

Every answer of the HTTP API comes from a gRPC call to the host's own services (``loopback``), so
its status is that call's status, mapped here. Refusals of the HTTP layer itself (a body that is
not JSON, a query parameter that is not an integer, a cross-site browser request) are
:class:`HttpError` with a gRPC code too, so they map through the same table and read the same way:
``{"error": {"code": "INVALID_ARGUMENT", "message": "..."}}``, as ``agentsessions --json`` prints.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import grpc
from aiohttp import web

_C = grpc.StatusCode

HTTP_STATUS: Mapping[grpc.StatusCode, int] = {
    _C.OK: 200,
    _C.INVALID_ARGUMENT: 400,
    _C.OUT_OF_RANGE: 400,
    _C.UNAUTHENTICATED: 401,
    _C.PERMISSION_DENIED: 403,
    _C.NOT_FOUND: 404,
    # The three "the session's state says no" codes; the body's code tells them apart.
    _C.ALREADY_EXISTS: 409,
    _C.ABORTED: 409,
    _C.FAILED_PRECONDITION: 409,
    _C.RESOURCE_EXHAUSTED: 429,
    # The call or the turn was cancelled (nginx's "client closed request", as Google APIs map it).
    _C.CANCELLED: 499,
    _C.UNKNOWN: 500,
    _C.INTERNAL: 500,
    _C.DATA_LOSS: 500,
    _C.UNIMPLEMENTED: 501,
    _C.UNAVAILABLE: 503,
    _C.DEADLINE_EXCEEDED: 504,
}

# What the HTTP layer's own refusals (aiohttp's routing and body limits) are called in the body.
_CODE_OF_HTTP: Mapping[int, grpc.StatusCode] = {
    400: _C.INVALID_ARGUMENT,
    404: _C.NOT_FOUND,
    405: _C.UNIMPLEMENTED,
    413: _C.RESOURCE_EXHAUSTED,
    415: _C.INVALID_ARGUMENT,
}


class HttpError(Exception):
    """A request the HTTP layer refuses before any call: its gRPC code, the message naming the
    field (or header, or parameter) and the rule, and the HTTP status when the table's is not it."""

    def __init__(self, code: grpc.StatusCode, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status if status is not None else HTTP_STATUS[code]


def http_status(code: grpc.StatusCode) -> int:
    return HTTP_STATUS.get(code, 500)


def error_body(code: grpc.StatusCode, message: str) -> dict[str, dict[str, str]]:
    return {"error": {"code": code.name, "message": message}}


def error_response(code: grpc.StatusCode, message: str, *, status: int | None = None) -> web.Response:
    """The JSON error answer; a 401 also says which scheme to use (RFC 6750)."""
    answer = web.Response(
        status=status if status is not None else http_status(code),
        text=json.dumps(error_body(code, message)),
        content_type="application/json",
    )
    if code == _C.UNAUTHENTICATED:
        answer.headers["WWW-Authenticate"] = 'Bearer realm="agentsessions"'
    return answer


def of_http_exception(exc: web.HTTPException) -> web.Response:
    """aiohttp's own refusal (no such route, method not allowed, body too large) as a JSON error."""
    code = _CODE_OF_HTTP.get(exc.status, _C.INVALID_ARGUMENT if exc.status < 500 else _C.INTERNAL)
    answer = error_response(code, exc.reason or str(exc), status=exc.status)
    if exc.status == 405 and "Allow" in exc.headers:
        answer.headers["Allow"] = exc.headers["Allow"]
    return answer
