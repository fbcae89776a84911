"""Every write the controller makes to the journal: appends under a fence at an expected head
(CAS), fence mints, lifecycle markers, and the writer one execution appends its records through.

A refused CAS or a superseded fence becomes ConcurrencyError (ABORTED); whatever is made durable
extends the journal cache, so the next read of the session costs nothing. Every event is checked
first (``agentsessions.host.recordable`` and the record size limit), whoever produced it: one that
cannot be journaled or read back is refused before anything is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import field

from agentsessions.host import recordable
from agentsessions.host.controller.errors import ConcurrencyError, RecordTooLargeError, UnrecordableError
from agentsessions.host.controller.journal_cache import JournalCache
from agentsessions.host.journal import canon
from agentsessions.host.journal.store import ConflictError, FencedError, JournalStore, StoreError
from agentsessions.host.limits import DEFAULT_LIMITS
from agentsessions.host.telemetry.genai import journal_append
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

# Called with each record an execution made durable (relayed to the Exec stream, in order).
OnRecord = Callable[[common_pb2.LogRecord], Awaitable[None]]


class JournalWriter:
    """Appends, fences and markers for every session of this host."""

    def __init__(
        self,
        store: JournalStore,
        cache: JournalCache,
        max_record_bytes: int = DEFAULT_LIMITS.max_record_bytes,
    ) -> None:
        self._store = store
        self._cache = cache
        self._max_record_bytes = max_record_bytes

    async def append(
        self, uid: str, events: Sequence[common_pb2.Event], head: int, fence: int, *, mint_fence: bool = False
    ) -> list[common_pb2.LogRecord]:
        """Append ``events`` after record ``head`` under ``fence`` (or, with ``mint_fence``, under a
        fence minted in the same transaction); ConcurrencyError when another writer won the head."""
        return await self.append_checked(uid, self.checked(events), head, fence, mint_fence=mint_fence)

    def checked(self, events: Sequence[common_pb2.Event]) -> list[common_pb2.Event]:
        """``events`` as the journal stores them, each checked (RecordTooLargeError,
        UnrecordableError) before anything is written."""
        normalized = [canon.normalize_event(e) for e in events]
        for event in normalized:
            self._check(event)
        return normalized

    async def append_checked(
        self,
        uid: str,
        normalized: Sequence[common_pb2.Event],
        head: int,
        fence: int,
        *,
        mint_fence: bool = False,
    ) -> list[common_pb2.LogRecord]:
        """:meth:`append` of events :meth:`checked` already made ready."""
        try:
            with journal_append(uid, len(normalized)) as span:
                records = await self._store.append(
                    uid, normalized, expected_head=head, fence=fence, mint_fence=mint_fence, normalized=True
                )
                span.wrote(records)
        except ConflictError as exc:
            raise ConcurrencyError(f"session {uid}: {exc}") from exc
        except FencedError as exc:
            raise ConcurrencyError(f"session {uid}: superseded by a newer writer: {exc}") from exc
        self._cache.appended(uid, records)
        return records

    def _check(self, event: common_pb2.Event) -> None:
        size = event.ByteSize()
        if size > self._max_record_bytes:
            raise RecordTooLargeError(
                f"{_kind(event)} record of {size} bytes exceeds the record size limit "
                f"(--max-record-bytes {self._max_record_bytes}); it was not journaled"
            )
        found = recordable.fault(event)
        if found is not None:
            raise UnrecordableError(f"{_kind(event)} record cannot be journaled: {found.path}: {found.rule}")

    async def mint(self, uid: str, head: int) -> int:
        """A new fence for this incarnation, minted only while the journal head is ``head``:
        a writer that lost the race for the head never supersedes the one that won it."""
        try:
            return await self._store.new_fence(uid, expected_head=head)
        except ConflictError as exc:
            raise ConcurrencyError(f"session {uid}: {exc}") from exc

    async def mint_at_head(self, uid: str) -> int:
        """A new fence at the head as the store reports it now."""
        return await self.mint(uid, (await self._store.head(uid)).seq)

    async def marker(
        self, uid: str, fence: int, lifecycle: common_pb2.Lifecycle, on_record: OnRecord | None = None
    ) -> common_pb2.LogRecord:
        """Append a lifecycle marker (no execution id) at the current head."""
        head = await self._store.head(uid)
        (rec,) = await self.append(
            uid, [common_pb2.Event(kind=common_pb2.EVENT_LIFECYCLE, lifecycle=lifecycle)], head.seq, fence
        )
        if on_record is not None:
            await on_record(rec)
        return rec


@struct
class ExecutionWriter:
    """Appends one execution's records in order, each extending the previous one (CAS).

    :meth:`append` returns once the record is durable (and relayed). :meth:`append_soon` is for a
    record nothing outside the journal acts on before the execution's next record: it is checked
    and ordered at once, and made durable with the execution's next append, or in the background
    :data:`SOON_LINGER_S` after it was ordered if no append comes first (so a model's OUTPUT and
    the harness's END that follows it share one commit). Every later append, marker or
    :meth:`flushed` of this execution writes it first, and a failure to write it is raised there
    and stays (the execution's head is then unknown). Records may be ordered while an earlier
    batch is being written; they follow it. The host answers a model call that way: its MODEL_CALL
    is ordered before the model is asked (unless ``--write-ahead-model-calls`` makes it durable
    first), the harness gets the completion while the OUTPUT waits, and whatever the harness does
    with it reaches the journal, the client or an effect only after both are durable. A crash in
    between leaves the journal as it stood before the call, or with the MODEL_CALL trailing; either
    way recovery asks the model once more.
    """

    journal: JournalWriter
    uid: str
    fence: int
    head: int  # the execution's last record so far (ordered; durable once ``flushed``)
    on_record: OnRecord | None = None
    strip_execution_id: bool = False  # legacy turns stay id-less in the journal
    # Ordered by append_soon, not yet handed to the store (the last len() of ``head``'s records).
    _pending: list[common_pb2.Event] = field(default_factory=list, init=False, repr=False)
    _timer: asyncio.TimerHandle | None = field(default=None, init=False, repr=False)
    # One write (and its relay) at a time, in the order they were asked for.
    _writing: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)
    _failure: BaseException | None = field(default=None, init=False, repr=False)
    _background: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)
    # Ordered records handed to the store and not yet appended to the journal cache.
    _on_the_way: list[common_pb2.Event] = field(default_factory=list, init=False, repr=False)
    # A write of ordered records whose caller stopped waiting (cancelled); it runs to its end.
    _left: asyncio.Task[list[common_pb2.LogRecord]] | None = field(default=None, init=False, repr=False)

    async def append(self, event: common_pb2.Event) -> common_pb2.LogRecord:
        if self.strip_execution_id:
            event.execution_id = ""
        (checked,) = self.journal.checked([event])
        records = await self._write([checked])
        return records[-1]

    def append_soon(self, event: common_pb2.Event) -> None:
        """Order ``event`` after the execution's records now; see the class docstring. Raises
        what :meth:`JournalWriter.checked` raises (nothing is ordered then)."""
        if self.strip_execution_id:
            event.execution_id = ""
        (checked,) = self.journal.checked([event])
        self._pending.append(checked)
        self.head += 1
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(SOON_LINGER_S, self._linger_over)

    def ordered(self) -> list[common_pb2.Event]:
        """The events :meth:`append_soon` ordered that the journal cache does not hold yet: those
        not handed to the store, and those on their way there."""
        return self._on_the_way + self._pending

    async def flushed(self) -> None:
        """Return once every record :meth:`append_soon` ordered is durable and relayed; raise the
        failure of one that was not. A cancel of the caller leaves a write it started running."""
        await self._write([])

    async def marker(self, lifecycle: common_pb2.Lifecycle) -> common_pb2.LogRecord:
        """A lifecycle marker after the execution's records, under its fence."""
        await self.flushed()
        return await self.journal.marker(self.uid, self.fence, lifecycle, self.on_record)

    def _linger_over(self) -> None:
        self._timer = None
        if not self._pending or self._failure is not None:
            return
        task = asyncio.get_running_loop().create_task(self._flush_in_background())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _flush_in_background(self) -> None:
        with contextlib.suppress(Exception):  # kept in _failure: raised to whoever writes next
            await self._write([])

    async def _write(self, events: list[common_pb2.Event]) -> list[common_pb2.LogRecord]:
        async with self._writing:
            left = self._left
            if left is not None:  # a write whose caller was cancelled: it finishes first
                self._left = None
                if not left.done():
                    await asyncio.wait({left})
                if left.cancelled() and self._failure is None:
                    self._failure = StoreError("journal write abandoned: the host is stopping")
            if self._failure is not None:
                raise self._failure
            pending = self._pending
            if not pending:
                if not events:
                    return []
                records = await self.journal.append_checked(self.uid, events, self.head, self.fence)
                return await self._relayed(records)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._pending, self._on_the_way = [], pending
            # Records ordered earlier go with it: written and relayed whatever becomes of this
            # caller (a cancel leaves the write running; the next write waits for it).
            write = asyncio.get_running_loop().create_task(
                self._write_ordered(pending + events, self.head - len(pending))
            )
            ended = write.get_loop().create_future()
            write.add_done_callback(functools.partial(_ended, ended))
            self._left = write
            await ended  # a cancel of this caller cancels ``ended`` only: the write goes on
            self._left = None
            return write.result()

    async def _write_ordered(
        self, batch: list[common_pb2.Event], expected: int
    ) -> list[common_pb2.LogRecord]:
        try:
            try:
                records = await self.journal.append_checked(self.uid, batch, expected, self.fence)
            finally:
                self._on_the_way = []  # in the journal cache now, or never written
            return await self._relayed(records)
        except BaseException as exc:  # the head is unknown now: every later write raises it
            self._failure = (
                StoreError("journal write abandoned: the host is stopping")
                if isinstance(exc, asyncio.CancelledError)
                else exc
            )
            raise

    async def _relayed(self, records: list[common_pb2.LogRecord]) -> list[common_pb2.LogRecord]:
        # Records ordered while this write was on its way come after it.
        self.head = records[-1].seq + len(self._pending)
        if self.on_record is not None:
            for rec in records:
                await self.on_record(rec)
        return records


# How long a record ordered with append_soon waits for the execution's next append to share its
# commit before it is written alone. A turn's END follows its model's OUTPUT by well under this
# even on a saturated host: at 32 turning sessions the loop's queue puts several milliseconds
# between the model's answer and the harness's END, and at 2 ms 64% of turns wrote their MODEL_CALL
# and OUTPUT alone (an append, its tasks and its relay more a turn); at 10 ms under 5% do
# (bench/NOTEBOOK.md, "The OUTPUT's linger"). A harness that thinks longer gets its OUTPUT durable
# (and seen), and a streaming model's first delta out, this much later.
SOON_LINGER_S = 0.010


def _ended(ended: asyncio.Future[None], task: asyncio.Task[list[common_pb2.LogRecord]]) -> None:
    """The write's end, told to its caller if it still waits (``asyncio.wait`` of the one task,
    without its bookkeeping: ~3 us a turn)."""
    # Its failure stays in _failure, raised to whoever writes next; nobody may be left to.
    if not task.cancelled():
        task.exception()
    if not ended.done():
        ended.set_result(None)


def _kind(event: common_pb2.Event) -> str:
    name = (
        common_pb2.EventKind.Name(event.kind)
        if event.kind in common_pb2.EventKind.values()
        else str(event.kind)
    )
    return name.removeprefix("EVENT_")
