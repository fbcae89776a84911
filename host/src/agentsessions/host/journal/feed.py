"""The journal feed: what this process learns about sessions changing, for the ones who follow them.

The store announces every append it made durable (the records, in order) and every deletion; the
PostgreSQL listener announces what other hosts committed (a session's new head, a deletion, a
change of its turn queue, a cancel request for a lease); the controller adds the live deltas of the
turns it runs. A follower subscribes to one session and reads its inbox. Inboxes are bounded: a
follower that falls behind loses its inbox at once (``overflowed``) and catches up from the journal
itself, so a slow watcher never makes the host hold more than ``limit`` items for it.

Nothing here is durable or authoritative: the journal is. A follower always reads the records it
has not seen from the store when the feed says something changed, so a lost or repeated
announcement costs a read, never a record.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sequence
from typing import Final

from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, session_pb2

__all__ = [
    "DEFAULT_INBOX_LIMIT",
    "CancelRequested",
    "DeltaGate",
    "FeedItem",
    "HeadMoved",
    "JournalFeed",
    "QueueChanged",
    "SessionDeleted",
    "Subscription",
]

# Items a subscriber may have waiting before it is told to catch up from the journal instead.
DEFAULT_INBOX_LIMIT: Final = 1024


@struct(frozen=True, slots=True)
class HeadMoved:
    """Another process appended: the session's head is now ``seq`` (read the records)."""

    seq: int


@struct(frozen=True, slots=True)
class SessionDeleted:
    """The session was deleted."""


@struct(frozen=True, slots=True)
class QueueChanged:
    """A turn was queued on the session, or a queued one started."""


@struct(frozen=True, slots=True)
class CancelRequested:
    """Someone asked the owner of the session's running ``execution_id`` to cancel it."""

    execution_id: str


FeedItem = (
    common_pb2.LogRecord | session_pb2.Delta | HeadMoved | SessionDeleted | QueueChanged | CancelRequested
)


class Subscription:
    """One follower's bounded inbox for one session."""

    def __init__(self, feed: JournalFeed, uid: str, limit: int) -> None:
        self.uid = uid
        self._feed = feed
        self._limit = max(1, limit)
        self._items: collections.deque[FeedItem] = collections.deque()
        self._wake = asyncio.Event()
        self._overflowed = False
        self.closed = False

    def put(self, item: FeedItem) -> None:
        if self._overflowed:
            return
        if len(self._items) >= self._limit:
            # Behind: drop everything; the follower reads what it missed from the journal.
            self._items.clear()
            self._overflowed = True
        else:
            self._items.append(item)
        self._wake.set()

    async def next(self, timeout_s: float) -> list[FeedItem] | None:
        """Everything waiting, in order (waiting up to ``timeout_s`` for something); None when the
        wait timed out. Check :meth:`take_overflow` first: after an overflow the list is empty."""
        if not self._items and not self._overflowed:
            self._wake.clear()
            try:
                async with asyncio.timeout(timeout_s):
                    await self._wake.wait()
            except TimeoutError:
                return None
        items = list(self._items)
        self._items.clear()
        return items

    def take_overflow(self) -> bool:
        """Whether the inbox overflowed since the last call (the follower must re-read)."""
        overflowed, self._overflowed = self._overflowed, False
        return overflowed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._feed.unsubscribe(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class DeltaGate:
    """The deltas bound for one destination (an Exec stream, a session's followers), which can
    hold a model call's frames back until its MODEL_CALL record has gone out ahead of them.

    The host may order a MODEL_CALL without waiting for it to be durable (controller/sink.py), so
    the model can stream before the record reaches anyone; readers take a call's deltas to come
    after its MODEL_CALL, as they do when the record is durable first. Between :meth:`hold` and
    the record passing :meth:`seen` (or :meth:`release`), frames wait here; then they go, in order.
    """

    __slots__ = ("_emit", "_held", "_model_call")

    def __init__(self, emit: Callable[[session_pb2.Delta], None]) -> None:
        self._emit = emit
        self._model_call = ""  # the id of the MODEL_CALL frames wait for; empty: none
        self._held: list[session_pb2.Delta] = []

    @property
    def holding(self) -> bool:
        return bool(self._model_call)

    def delta(self, delta: session_pb2.Delta) -> None:
        if self._model_call:
            self._held.append(delta)
        else:
            self._emit(delta)

    def hold(self, model_call_id: str) -> None:
        """Hold frames until the MODEL_CALL record with ``model_call_id`` is :meth:`seen`."""
        self.release()
        self._model_call = model_call_id

    def seen(self, record: common_pb2.LogRecord) -> None:
        """A record went out: the held frames follow it if it is the MODEL_CALL they wait for."""
        if (
            self._model_call
            and record.event.kind == common_pb2.EVENT_MODEL_CALL
            and record.event.model.id == self._model_call
        ):
            self.release()

    def release(self) -> None:
        """Let the held frames go now and stop holding (the record will not come)."""
        self._model_call = ""
        held, self._held = self._held, []
        for delta in held:
            self._emit(delta)


# Called for every announcement about any session other than records and deltas (the
# controller's queue hints and cancel wake-ups).
FeedListener = Callable[[str, FeedItem], None]


class JournalFeed:
    """Per-session subscriptions, and listeners of every session."""

    def __init__(self, inbox_limit: int = DEFAULT_INBOX_LIMIT) -> None:
        self._inbox_limit = inbox_limit
        self._subs: dict[str, set[Subscription]] = {}
        self._listeners: list[FeedListener] = []
        # Sessions whose followers' deltas wait for a MODEL_CALL record (DeltaGate).
        self._gates: dict[str, DeltaGate] = {}

    def subscribe(self, uid: str, limit: int | None = None) -> Subscription:
        sub = Subscription(self, uid, self._inbox_limit if limit is None else limit)
        self._subs.setdefault(uid, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.uid)
        if subs is None:
            return
        subs.discard(sub)
        if not subs:
            del self._subs[sub.uid]

    def listen(self, listener: FeedListener) -> None:
        self._listeners.append(listener)

    def watched(self, uid: str) -> int:
        """How many subscriptions follow ``uid``."""
        return len(self._subs.get(uid, ()))

    def _publish(self, uid: str, item: FeedItem) -> None:
        for listener in self._listeners:
            listener(uid, item)
        subs = self._subs.get(uid)
        if subs:
            for sub in tuple(subs):
                sub.put(item)

    # -- what the store, the listener and the controller announce ---------------------------

    def appended(self, uid: str, records: Sequence[common_pb2.LogRecord]) -> None:
        """Records this process made durable, in seq order."""
        subs = self._subs.get(uid)
        gate = self._gates.get(uid)
        if gate is None:
            if subs:
                for sub in tuple(subs):
                    for record in records:
                        sub.put(record)
            return
        for record in records:  # one by one: held deltas go right after their MODEL_CALL
            if subs:
                for sub in tuple(subs):
                    sub.put(record)
            gate.seen(record)
        if not gate.holding:
            del self._gates[uid]

    def head_moved(self, uid: str, seq: int) -> None:
        self._publish(uid, HeadMoved(seq))

    def deleted(self, uid: str) -> None:
        self._publish(uid, SessionDeleted())

    def queue_changed(self, uid: str) -> None:
        self._publish(uid, QueueChanged())

    def cancel_requested(self, uid: str, execution_id: str) -> None:
        self._publish(uid, CancelRequested(execution_id))

    def delta(self, uid: str, delta: session_pb2.Delta) -> None:
        gate = self._gates.get(uid)
        if gate is not None:
            gate.delta(delta)
        else:
            self._put_delta(uid, delta)

    def hold_deltas(self, uid: str, model_call_id: str) -> None:
        """``uid``'s deltas wait for its MODEL_CALL record with ``model_call_id`` (DeltaGate)."""
        gate = self._gates.get(uid)
        if gate is None:
            gate = self._gates[uid] = DeltaGate(lambda delta: self._put_delta(uid, delta))
        gate.hold(model_call_id)

    def release_deltas(self, uid: str) -> None:
        """``uid``'s held deltas go now (the record they wait for will not be announced)."""
        gate = self._gates.pop(uid, None)
        if gate is not None:
            gate.release()

    def _put_delta(self, uid: str, delta: session_pb2.Delta) -> None:
        subs = self._subs.get(uid)
        if subs:
            for sub in tuple(subs):
                sub.put(delta)
