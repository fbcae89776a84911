"""Request and response messages as proto3 JSON over HTTP.

Answers use lowerCamelCase field names (as grpcurl and ``agentsessions --json`` print), or the
proto field names with ``?json_names=proto``: those are the names the journal's ``content_hash``
is computed over (spec 3.2), so a client can recompute a record's hash from the JSON it received.
Requests accept either. A POST body is the RPC's request message; a GET's query parameters are
its fields. Anything that does not parse is INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Literal, TypeVar

import grpc
from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import Message

from agentsessions.host.http.status import HttpError

Names = Literal["camel", "proto"]
NAMES_PARAMETER = "json_names"
M = TypeVar("M", bound=Message)

_INVALID = grpc.StatusCode.INVALID_ARGUMENT
_INT64_MAX = 2**63 - 1


def names_of(request: web.Request) -> Names:
    value = request.query.get(NAMES_PARAMETER, "camel")
    if value == "camel":
        return "camel"
    if value == "proto":
        return "proto"
    raise HttpError(_INVALID, f"{NAMES_PARAMETER}: must be 'camel' or 'proto', got {value!r}")


def as_dict(message: Message, names: Names) -> dict[str, object]:
    as_json: dict[str, object] = json_format.MessageToDict(
        message, preserving_proto_field_name=names == "proto"
    )
    return as_json


def dumps(message: Message, names: Names) -> str:
    return json.dumps(as_dict(message, names), ensure_ascii=False, separators=(",", ":"))


def json_response(message: Message, names: Names) -> web.Response:
    return web.Response(text=dumps(message, names), content_type="application/json")


def _is_json(content_type: str) -> bool:
    return content_type == "application/json" or content_type.endswith("+json")


async def body_message(request: web.Request, message: M) -> M:
    """Parse the request body (a JSON object, or nothing) into ``message``.

    Only ``application/json`` is read: a browser sends that type across sites only after a CORS
    preflight this host never grants, so a form on another site cannot post here."""
    if request.body_exists and not _is_json(request.content_type):
        raise HttpError(
            _INVALID,
            f"Content-Type: must be application/json, got {request.content_type!r}",
            status=415,
        )
    try:
        text = await request.text() if request.body_exists else ""
    except UnicodeDecodeError as exc:
        raise HttpError(_INVALID, f"request body: not {exc.encoding}: {exc.reason}") from None
    except LookupError:
        raise HttpError(_INVALID, f"Content-Type: unknown charset {request.charset!r}") from None
    if not text.strip():
        return message
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise HttpError(_INVALID, f"request body: not JSON: {exc}") from None
    except RecursionError:
        raise HttpError(_INVALID, "request body: JSON nested too deeply") from None
    if not isinstance(parsed, dict):
        raise HttpError(_INVALID, f"request body: must be a JSON object ({type(message).__name__})")
    try:
        json_format.ParseDict(parsed, message)
    except json_format.ParseError as exc:
        raise HttpError(_INVALID, f"request body: {exc}") from None
    except RecursionError:
        raise HttpError(_INVALID, "request body: nested too deeply for the message") from None
    return message


def query_message(request: web.Request, message: M, *, reserved: Collection[str] = ()) -> M:
    """The query parameters (but ``json_names`` and ``reserved``) as fields of ``message``."""
    fields: dict[str, str] = {}
    for key, value in request.query.items():
        if key == NAMES_PARAMETER or key in reserved:
            continue
        if key in fields:
            raise HttpError(_INVALID, f"{key}: given more than once")
        fields[key] = value
    try:
        json_format.ParseDict(fields, message)
    except json_format.ParseError as exc:
        raise HttpError(_INVALID, f"query: {exc}") from None
    return message


def integer(value: str, name: str) -> int:
    """A non-negative decimal integer from a header or parameter, or INVALID_ARGUMENT naming it."""
    if not (value.isascii() and value.isdigit()) or len(value) > 19 or int(value) > _INT64_MAX:
        raise HttpError(_INVALID, f"{name}: must be a non-negative 64-bit integer, got {value[:40]!r}")
    return int(value)


def flag(request: web.Request, name: str, default: bool) -> bool:
    """A boolean query parameter: true/false (or 1/0); absent is ``default``."""
    value = request.query.get(name)
    if value is None:
        return default
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    raise HttpError(_INVALID, f"{name}: must be true or false, got {value[:40]!r}")
