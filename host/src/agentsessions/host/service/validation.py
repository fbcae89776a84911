"""Request validation: every rule names the field it applies to."""

from __future__ import annotations

import re
from collections.abc import Mapping

from agentsessions.host import recordable
from agentsessions.host.controller.errors import InvalidArgumentError
from agentsessions.host.limits import DEFAULT_LIMITS
from agentsessions.v1 import common_pb2

MAX_NAME = 256
MAX_MAP_ENTRIES = 64
MAX_KEY = 256
MAX_VALUE = 4096
MAX_CONFIG_BYTES = 1 << 20
MAX_INPUTS = 256
MAX_UID = 128
HARNESS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# C0 control characters (below U+0020): one search, not a generator step per character.
_CONTROL = re.compile(r"[\x00-\x1f]")


def require(field: str, value: str) -> str:
    if not value:
        raise InvalidArgumentError(field, "is required")
    return value


def session_uid(field: str, value: str) -> str:
    require(field, value)
    if len(value) > MAX_UID:
        raise InvalidArgumentError(field, f"must be at most {MAX_UID} characters")
    if _CONTROL.search(value):
        raise InvalidArgumentError(field, "must not contain control characters")
    return value


def bounded(field: str, value: str, limit: int = MAX_NAME) -> str:
    if len(value) > limit:
        raise InvalidArgumentError(field, f"must be at most {limit} characters, got {len(value)}")
    if _CONTROL.search(value):
        raise InvalidArgumentError(field, "must not contain control characters")
    return value


def harness_name(field: str, value: str) -> str:
    if value and (len(value) > 63 or not HARNESS_NAME.match(value)):
        raise InvalidArgumentError(
            field, f"{value!r} is not an RFC 1123 DNS label (a-z, 0-9, '-', at most 63)"
        )
    return value


def string_map(field: str, values: Mapping[str, str]) -> dict[str, str]:
    if len(values) > MAX_MAP_ENTRIES:
        raise InvalidArgumentError(field, f"must hold at most {MAX_MAP_ENTRIES} entries, got {len(values)}")
    for key, value in values.items():
        if not key:
            raise InvalidArgumentError(field, "keys must not be empty")
        bounded(f"{field}[{key!r}]", key, MAX_KEY)
        if len(value) > MAX_VALUE:
            raise InvalidArgumentError(f"{field}[{key!r}]", f"value must be at most {MAX_VALUE} characters")
        if "\x00" in value:
            # Any other text is a value; PostgreSQL's text and jsonb cannot hold this one.
            raise InvalidArgumentError(f"{field}[{key!r}]", "value must not contain NUL (U+0000)")
    return dict(values)


def non_negative(field: str, value: int) -> int:
    if value < 0:
        raise InvalidArgumentError(field, f"must not be negative, got {value}")
    return value


def inputs(
    field: str, messages: list[common_pb2.Message], max_bytes: int = DEFAULT_LIMITS.max_input_bytes
) -> list[common_pb2.Message]:
    if len(messages) > MAX_INPUTS:
        raise InvalidArgumentError(field, f"must hold at most {MAX_INPUTS} messages, got {len(messages)}")
    size = sum(m.ByteSize() for m in messages)
    if size > max_bytes:
        raise InvalidArgumentError(
            field, f"{size} bytes exceed the input size limit of {max_bytes} bytes (--max-input-bytes)"
        )
    for i, m in enumerate(messages):
        if not m.role:
            raise InvalidArgumentError(f"{field}[{i}].role", 'is required (for example "user")')
        if not m.parts:
            raise InvalidArgumentError(f"{field}[{i}].parts", "must hold at least one part")
        for j, part in enumerate(m.parts):
            if part.WhichOneof("part") is None:
                raise InvalidArgumentError(f"{field}[{i}].parts[{j}]", "must set one kind of part")
        found = recordable.fault(m, f"{field}[{i}]")
        if found is not None:
            raise InvalidArgumentError(found.path, found.rule)
    return messages


def identity(
    field: str, ident: common_pb2.IdentityRef, max_bytes: int = DEFAULT_LIMITS.max_identity_bytes
) -> common_pb2.IdentityRef:
    """An identity's principal, issuer and subject: each within the identity size limit."""
    for name in ("principal", "issuer", "subject"):
        value: str = getattr(ident, name)
        size = len(value.encode())
        if size > max_bytes:
            raise InvalidArgumentError(
                f"{field}.{name}",
                f"{size} bytes exceed the identity field limit of {max_bytes} bytes (--max-identity-bytes)",
            )
        if _CONTROL.search(value):
            raise InvalidArgumentError(f"{field}.{name}", "must not contain control characters")
    return ident
