"""Idempotency keys: a request carrying ``idempotency-key`` does its work once.

The key belongs to the caller (its principal's scope) and names one request: the method and a
digest of what the request asks (``digest``; a turn's ``deadline_unix`` is left out, a per-attempt
bound a retrying client may recompute). The same key with the same request gets the same outcome;
with a different request it is refused, ALREADY_EXISTS naming the key. Records live beside the
journal (``journal.live``) until the host's retention passes.

A key is reserved before the work, with the ids the work will create planned in it (the session of
a CreateSession or of an Exec without one, a Fork's children, an Exec's execution), so a retry after
a crash creates the same things, never new ones; an Exec's key becomes DONE in the transaction of
its EXECUTION_START, so a retry that finds it DONE streams that execution.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Final

from google.protobuf.message import Message

from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller.errors import IdempotencyKeyConflictError
from agentsessions.host.journal.live import PENDING, KeyRecord, LiveStore

DEFAULT_RETENTION_S: Final = 24 * 3600.0

Part = Message | bytes | str | int | bool | None


def digest(method: str, parts: Iterable[Part]) -> str:
    """A digest of one request's content: each part length-prefixed, messages serialized
    deterministically."""
    h = hashlib.sha256(method.encode())
    for part in parts:
        if isinstance(part, Message):
            raw = part.SerializeToString(deterministic=True)
        elif isinstance(part, bytes):
            raw = part
        else:
            raw = repr(part).encode()
        h.update(len(raw).to_bytes(8, "big"))
        h.update(raw)
    return h.hexdigest()


class Keys:
    """The idempotency records of one host's callers."""

    def __init__(self, live: LiveStore, retention_s: float = DEFAULT_RETENTION_S) -> None:
        self.live = live
        self.retention_ns = int(retention_s * 1e9)

    def request(self, call: CallContext, method: str, parts: Iterable[Part]) -> KeyRecord | None:
        """The record this call's key would hold (None: the call carries no key)."""
        if not call.idempotency_key:
            return None
        scope = call.principal.principal if call.principal is not None else ""
        now = time.time_ns()
        return KeyRecord(
            scope,
            call.idempotency_key,
            method,
            digest(method, parts),
            PENDING,
            created_at_ns=now,
            expires_at_ns=now + self.retention_ns,
        )

    def check(self, held: KeyRecord, asked: KeyRecord) -> KeyRecord:
        """``held`` when it was made for the request ``asked`` describes; refused otherwise."""
        if held.method != asked.method or held.digest != asked.digest:
            when = datetime.fromtimestamp(held.created_at_ns / 1e9, UTC).isoformat(timespec="seconds")
            raise IdempotencyKeyConflictError(
                f"idempotency-key {asked.key!r} was already used for a different request "
                f"({held.method} at {when.replace('+00:00', 'Z')}); send a new key with a new request"
            )
        return held

    async def existing(self, asked: KeyRecord) -> KeyRecord | None:
        """What the key holds already (checked against the request), None when it is new."""
        held = await self.live.key(asked.scope, asked.key)
        return None if held is None else self.check(held, asked)

    async def reserve(self, planned: KeyRecord) -> KeyRecord:
        """Reserve the key with what it plans; what it holds afterwards (another reservation of
        the same request wins over this one if it came first)."""
        return self.check(await self.live.reserve_key(planned), planned)
