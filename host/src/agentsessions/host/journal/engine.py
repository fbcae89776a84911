"""``DialectStore``: the one JournalStore implementation, over any dialect.

Every write becomes one entry of a group-commit queue (``groupcommit.GroupCommit``); a batch is
applied in queue order inside one dialect transaction. Consecutive appends and fence mints in a
batch form a run: their sessions' heads are fetched once (or taken from the head cache), the
rules check and chain them all, and one statement's worth of rows and head moves is written.
Any other write is a small program over the transaction's statements that checks every rule
before its first write, so a refused write leaves nothing behind and its batch carries on.

A refused write fails alone; a transaction that fails fails every write it carried (retried one
by one when the dialect says one of them may have caused it). Callers return once their batch
committed. The memory dialect has no queue: its writes apply at once, atomically on the loop.

The head cache keeps the head of every session this store's writer last wrote or read under its
lock, so an append to a session this writer owns reads nothing before it writes. It is trusted
only in a transaction the dialect vouches for (``Transaction.foreign_writes``: nobody else
committed since this writer's last transaction), dropped otherwise and after any failure.

Where the dialect can tell without I/O whether anyone committed since this store's last commit
(SQLite: ``Dialect.change_mark``, the WAL index's change counter) the store also keeps the rows
of sessions it reads, moved along by its own commits, so a turn's admission reads nothing either.
A kept row is answered only while nobody else has committed since (another process's commit is
seen at once; this store's next transaction then drops every kept row), and is kept only when it
shows the head the writer knows. Between this store's own commit and the loop taking it, rows of
the sessions that commit does not touch still answer (``_apply_announced``, ``_kept``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Generic, TypeVar, overload

from agentsessions.host.journal import (
    MAX_SEQ,
    clamp_page_size,
    decode_page_token,
    encode_page_token,
    execstate,
    rules,
)
from agentsessions.host.journal.dialect import Dialect, Transaction
from agentsessions.host.journal.execstate import ExecProjection
from agentsessions.host.journal.feed import JournalFeed
from agentsessions.host.journal.groupcommit import GroupCommit
from agentsessions.host.journal.health import JournalHealth
from agentsessions.host.journal.rules import AppendRequest, MintRequest, SessionHead
from agentsessions.host.journal.store import Head, JournalUnavailableError, SessionRow, StoreError
from agentsessions.sdk.structs import replace, struct
from agentsessions.v1 import common_pb2, harness_registry_pb2

__all__ = ["DEFAULT_MAX_BATCH", "HEAD_CACHE_SIZE", "DialectStore", "HeadView", "WriterStats"]

DEFAULT_MAX_BATCH: Final = 1024
# Sessions whose heads the writer remembers; the oldest written is forgotten first.
HEAD_CACHE_SIZE: Final = 4096
# Writers of a committed batch woken per event-loop turn (_settle_in_turns).
SETTLE_PER_TURN: Final = 16

_T = TypeVar("_T")
_R = TypeVar("_R")
_Outcome = Any  # a write's result, or the StoreError refusing it


@struct
class WriterStats:
    """What the writer has committed so far: appends and events made durable, and transactions
    (appends per commit shows how well concurrent appends group)."""

    commits: int = 0
    appends: int = 0
    events: int = 0
    failed_commits: int = 0
    # Sessions whose head was read from the database (not known from the head cache).
    head_reads: int = 0
    # Session rows answered from memory, and read from the database (dialects with change marks).
    row_hits: int = 0
    row_reads: int = 0


@struct(eq=False, slots=True)
class _Write(Generic[_T]):
    """One queued write: an append, a fence mint, or a program over the transaction.

    ``committed`` turns its outcome into what its caller gets, once the write is durable: it runs as
    the batch is settled, on the loop, in commit order, and whether or not the caller still waits
    (a caller cancelled meanwhile does not undo the write, so what announces it must not depend on
    the caller's continuation)."""

    request: AppendRequest | MintRequest | None
    program: Callable[[Transaction, HeadView], Awaitable[Any]] | None
    future: asyncio.Future[_T]
    committed: Callable[[Any], _T] | None = None


class HeadView:
    """The heads one transaction sees: the cache (when trusted) under this batch's own changes.

    A write program that changes a session's row calls ``forget`` (or ``set`` with the new head);
    one that only moved its head with ``append_rows`` calls ``moved``, so the row kept in memory
    moves along instead of being read again."""

    __slots__ = ("cache", "changed", "moved_at", "reads")

    def __init__(self, cache: dict[str, SessionHead]) -> None:
        self.cache = cache
        self.changed: dict[str, SessionHead | None] = {}
        # Sessions whose head append_rows moved (with the row's new update time), and nothing else.
        self.moved_at: dict[str, int] = {}
        self.reads = 0  # heads this transaction read from the database

    def get(self, uid: str) -> SessionHead | None:
        if uid in self.changed:
            return self.changed[uid]
        return self.cache.get(uid)

    def set(self, head: SessionHead) -> None:
        # Only rows are remembered: a session created elsewhere is then read, never assumed absent.
        self.changed[head.uid] = head if head.exists else None
        self.moved_at.pop(head.uid, None)

    def moved(self, head: SessionHead, now_ns: int) -> None:
        """``head`` as ``append_rows(..., now_ns)`` left it: only the head columns changed."""
        self.changed[head.uid] = head
        self.moved_at[head.uid] = now_ns

    def forget(self, uid: str) -> None:
        self.changed[uid] = None
        self.moved_at.pop(uid, None)


class DialectStore:
    """JournalStore on one dialect (see the module docstring)."""

    def __init__(self, dialect: Dialect, *, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        self._dialect = dialect
        self._closing = False
        self._heads: dict[str, SessionHead] = {}
        # Rows of sessions as this store's writer last committed them (see the module docstring),
        # answered while the dialect's change mark is still the one of that commit.
        self._rows: dict[str, SessionRow] = {}
        self._vouched: int | None = None
        # The transaction on its way (set by its body, before its COMMIT): the mark the
        # rows stand at, the mark its commit will leave, and the sessions whose rows it changes.
        self._committing: tuple[int, int, frozenset[str]] | None = None
        self._queue: GroupCommit[_Write[Any]] | None = None
        # Unwritable after a write the journal refused for want of storage; writable after any commit.
        self.health = JournalHealth()
        if not dialect.immediate:
            self._queue = GroupCommit(self._commit, max_batch=max_batch, max_in_flight=dialect.max_in_flight)
        self.stats = WriterStats()
        # What this process made durable, announced to whoever follows a session (live Watch).
        self.feed = JournalFeed()

    def work_inline_while(self, quiet: Callable[[], bool]) -> None:
        """Let the store do its work on the event loop's thread while ``quiet()`` holds, where
        that is faster (SQLite: a commit or row lookup with nothing queued on its thread)."""
        self._dialect.work_inline_while(quiet)

    # -- lifecycle ---------------------------------------------------------------------------

    async def close(self) -> None:
        """Commit everything already queued, then release the dialect's connections."""
        if self._closing:
            return
        self._closing = True
        if self._queue is not None:
            await self._queue.drain()
        await self._dialect.close()

    def _check_open(self, what: str) -> None:
        if self._closing:
            raise StoreError(f"{what}: store is closed")

    # -- the writer --------------------------------------------------------------------------

    async def probe(self) -> None:
        """One small write (the journal_probe row) through the writer: returns once it committed,
        raises the refusal (JournalUnavailableError while the journal takes no writes)."""

        async def program(tx: Transaction, view: HeadView) -> None:
            await tx.touch_probe(time.time_ns())

        await self.write("probe", program)

    @overload
    async def write(self, what: str, program: Callable[[Transaction, HeadView], Awaitable[_T]]) -> _T: ...

    @overload
    async def write(
        self,
        what: str,
        program: Callable[[Transaction, HeadView], Awaitable[_T]],
        committed: Callable[[_T], _R],
    ) -> _R: ...

    async def write(
        self,
        what: str,
        program: Callable[[Transaction, HeadView], Awaitable[Any]],
        committed: Callable[[Any], Any] | None = None,
    ) -> Any:
        """Run ``program`` in the writer's next transaction. It must check every rule before its
        first statement that writes (a StoreError it raises refuses only this write). With
        ``committed``, what the program returned goes through it once durable, even if the caller
        has stopped waiting (announcements belong there), and the caller gets what it returns."""
        return await self._submit(what, None, program, committed)

    async def _submit(
        self,
        what: str,
        request: AppendRequest | MintRequest | None,
        program: Callable[[Transaction, HeadView], Awaitable[Any]] | None,
        committed: Callable[[Any], Any] | None = None,
    ) -> Any:
        self._check_open(what)
        write: _Write[Any] = _Write(request, program, asyncio.get_running_loop().create_future(), committed)
        if self._queue is None:
            await self._commit([write])
            return write.future.result()  # settled: the dialect applied it at once
        self._queue.submit(write)
        return await write.future

    async def _commit(self, batch: list[_Write[Any]]) -> None:
        try:
            await self._commit_batch(batch)
        finally:
            # Whatever escaped above (a bug, say), nobody waits forever on a write of this batch.
            for write in batch:
                _settle(write.future, StoreError("journal write outcome unknown: its commit failed"))

    async def _commit_batch(self, batch: list[_Write[Any]]) -> None:
        try:
            outcomes, view, foreign = await self._dialect.transaction(
                lambda tx: self._apply_announced(tx, batch)
            )
        except (asyncio.CancelledError, KeyboardInterrupt, SystemExit) as exc:
            # Nobody may hang on a write whose outcome the writer will never learn.
            self._forget_all()
            for write in batch:
                _settle(write.future, StoreError(f"journal write abandoned: {exc!r}"))
            raise
        except Exception as exc:
            # Whatever the transaction did is undone, or its outcome is unknown: read heads afresh.
            self._forget_all()
            self.stats.failed_commits += 1
            failure = self._dialect.batch_failure(exc)
            if issubclass(failure.kind, JournalUnavailableError):
                self.health.failed(failure.message)
            if failure.retry_alone and len(batch) > 1:
                for write in batch:
                    await self._commit([write])
                return
            for write in batch:
                # One exception object per waiter: each raise extends its own traceback.
                refusal = failure.kind(failure.message)
                refusal.__cause__ = exc
                _settle(write.future, refusal)
            return
        self._remember(view, foreign)
        self.health.recovered()
        self.stats.commits += 1
        self.stats.head_reads += view.reads
        settled: list[tuple[asyncio.Future[Any], _Outcome]] = []
        for write, outcome in zip(batch, outcomes, strict=True):
            if isinstance(outcome, BaseException):  # a refusal: nothing of this write is durable
                settled.append((write.future, outcome))
                continue
            if isinstance(write.request, AppendRequest):
                self.stats.appends += 1
                self.stats.events += len(write.request.prepared.events)
            if write.committed is not None:
                try:
                    outcome = write.committed(outcome)
                except Exception as exc:  # only this write's caller hears of it; the batch settles on
                    outcome = exc
            settled.append((write.future, outcome))
        await _settle_in_turns(settled)

    def _forget_all(self) -> None:
        self._heads.clear()
        self._rows.clear()
        self._vouched = None
        self._committing = None

    def _remember(self, view: HeadView, foreign: bool) -> None:
        cache = self._heads
        if foreign:
            cache.clear()
        for uid, head in view.changed.items():
            cache.pop(uid, None)
            if head is not None:
                cache[uid] = head
        while len(cache) > HEAD_CACHE_SIZE:
            del cache[next(iter(cache))]
        self._vouched = self._dialect.committed_mark
        self._committing = None
        rows = self._rows
        if foreign:
            rows.clear()
        if not rows:
            return
        moved_at = view.moved_at
        for uid, head in view.changed.items():
            row = rows.pop(uid, None)
            if row is None or head is None or uid not in moved_at:
                continue  # created, deleted or rewritten: read again when asked
            rows[uid] = replace(
                row,
                compute_state=head.compute_state,
                update_time_ns=moved_at[uid],
                last_seq=head.seq,
                last_hash=head.hash,
                exec_projection=head.exec,
            )
        while len(rows) > HEAD_CACHE_SIZE:
            del rows[next(iter(rows))]

    async def _apply_announced(
        self, tx: Transaction, batch: list[_Write[Any]]
    ) -> tuple[list[_Outcome], HeadView, bool]:
        """:meth:`_apply`, then, before the dialect commits it, which sessions' rows it changes:
        between the commit and the loop taking it (:meth:`_remember`) the other rows kept still
        hold, and :meth:`_kept` answers them."""
        applied = await self._apply(tx, batch, self._heads)
        _, view, foreign = applied
        base = self._vouched
        # Nobody has committed since the commit that left ``base`` (else ``foreign``), and nobody
        # else commits before this transaction does (it holds the write lock): its commit alone
        # moves the mark, to ``base + 1``.
        if foreign or base is None:
            self._committing = None
        else:
            self._committing = (base, base + 1, frozenset(view.changed))
        return applied

    async def _apply(
        self, tx: Transaction, batch: list[_Write[Any]], cache: dict[str, SessionHead]
    ) -> tuple[list[_Outcome], HeadView, bool]:
        """The batch, in order, inside the dialect's transaction (SQLite: on the event loop's thread, or
        on the writer's while another process holds the write lock)."""
        foreign = await tx.foreign_writes()
        view = HeadView({} if foreign else cache)
        if len(batch) == 1 and batch[0].request is not None:  # the common batch: one append
            return await _apply_run(tx, [batch[0].request], view), view, foreign
        outcomes: list[_Outcome] = []
        i = 0
        while i < len(batch):
            write = batch[i]
            if write.program is not None:
                try:
                    outcomes.append(await write.program(tx, view))
                except StoreError as exc:
                    outcomes.append(exc)
                i += 1
                continue
            j = i + 1
            while j < len(batch) and batch[j].program is None:
                j += 1
            requests = [w.request for w in batch[i:j] if w.request is not None]
            outcomes.extend(await _apply_run(tx, requests, view))
            i = j
        return outcomes, view, foreign

    # -- session rows ------------------------------------------------------------------------

    async def create_session(self, row: SessionRow) -> SessionRow:
        async def program(tx: Transaction, view: HeadView) -> SessionRow:
            new = rules.plan_new_session(row, time.time_ns())
            if not await tx.insert_session_if_new(new):
                raise rules.session_exists(row.uid)
            view.set(_head_of(new))
            return new.row

        return await self.write("create session", program)

    async def get_session(self, uid: str) -> SessionRow | None:
        self._check_open("get session")
        mark = self._dialect.change_mark()
        if mark is None:
            return await self._dialect.get_row(uid)
        kept = self._kept(uid, mark)
        if kept is not None:
            self.stats.row_hits += 1
            return kept
        rows = self._rows
        self.stats.row_reads += 1
        found = await self._dialect.get_row(uid)
        if found is not None:
            # Kept only when it shows the head the writer knows: a row read while a commit of this
            # session was on its way (older or newer than the head cache) is not kept.
            head = self._heads.get(uid)
            if head is not None and head.seq == found.last_seq and head.hash == found.last_hash:
                rows.pop(uid, None)
                rows[uid] = found
        return found

    def _kept(self, uid: str, mark: int) -> SessionRow | None:
        """``uid``'s kept row, if the journal's change ``mark`` says it still holds: nobody has
        committed since this store's last commit, or only this store's commit on its way, which
        changes other sessions' rows."""
        if mark != self._vouched:
            committing = self._committing
            if committing is None:
                return None
            base, after, changed = committing
            if mark != after or base != self._vouched or uid in changed:
                return None
        return self._rows.get(uid)

    async def list_sessions(
        self, project: str, page_size: int, page_token: str
    ) -> tuple[list[SessionRow], str]:
        self._check_open("list sessions")
        size = clamp_page_size(page_size)
        after = decode_page_token(page_token) if page_token else None
        found = await self._dialect.list_rows(project, after, size + 1)
        rows = found[:size]
        token = ""
        if len(found) > size:
            token = encode_page_token(rows[-1].create_time_ns, rows[-1].uid)
        return rows, token

    async def delete_session(self, uid: str, *, purge: bool) -> SessionRow:
        async def program(tx: Transaction, view: HeadView) -> SessionRow:
            row = await tx.live_row(uid)
            if row is None:
                raise rules.not_found(uid)
            now = time.time_ns()
            await tx.mark_deleted(uid, now)
            if purge:
                await tx.purge(uid)
            view.forget(uid)
            return replace(row, update_time_ns=now)

        deleted: SessionRow = await self.write("delete session", program)
        self.feed.deleted(uid)
        return deleted

    async def new_fence(self, uid: str, expected_head: int | None = None) -> int:
        fence: int = await self._submit("new fence", MintRequest(uid, expected_head), None)
        return fence

    # -- journal -----------------------------------------------------------------------------

    async def append(
        self,
        uid: str,
        events: Sequence[common_pb2.Event],
        *,
        expected_head: int,
        fence: int,
        mint_fence: bool = False,
        normalized: bool = False,
    ) -> list[common_pb2.LogRecord]:
        prepared = rules.prepare_events(events, normalized=normalized)
        request = AppendRequest(uid, prepared, expected_head, fence, mint_fence)

        def announced(appended: rules.Appended) -> list[common_pb2.LogRecord]:
            records = rules.appended_records(prepared, appended)
            self.feed.appended(uid, records)  # at commit: watchers see it even if our caller left
            return records

        records: list[common_pb2.LogRecord] = await self._submit("append", request, None, announced)
        return records

    async def read(self, uid: str, from_seq: int = 1, to_seq: int = 0) -> list[common_pb2.LogRecord]:
        self._check_open("read")
        if from_seq > MAX_SEQ:
            return []  # past any head a journal can reach (and past what SQL integers hold)
        return await self._dialect.read(uid, max(1, from_seq), min(max(0, to_seq), MAX_SEQ))

    async def head(self, uid: str) -> Head:
        self._check_open("head")
        anchor = await self._dialect.anchor(uid)
        return Head(seq=0, hash="") if anchor is None else Head(seq=anchor[0], hash=anchor[1])

    async def verify(self, uid: str) -> int:
        self._check_open("verify")
        check = rules.ChainCheck(uid)
        anchor = await self._dialect.verify_scan(uid, check)
        return check.finish(anchor)

    async def fork(
        self,
        parent_uid: str,
        at_seq: int,
        children: Sequence[SessionRow],
        marker: common_pb2.Event,
    ) -> list[SessionRow]:
        if not children:
            self._check_open("fork")
            return []
        rules.require_distinct_uids(children)
        prepared = rules.prepare_events([marker])
        uids = [c.uid for c in children]
        # The children's execution state is their parent's at at_seq: the parent's own when that
        # is its head (the usual fork, nothing to read), else the prefix folded here, before the
        # write (records 1..at_seq never change; the program checks they are still the ones read).
        folded: tuple[ExecProjection, str] | None = None
        if at_seq > 0 and (await self.head(parent_uid)).seq != at_seq:
            prefix = await self.read(parent_uid, 1, at_seq)
            if len(prefix) == at_seq:
                events = (r.event for r in prefix)
                folded = execstate.fold(events, fork_seq=at_seq), prefix[-1].content_hash

        async def program(tx: Transaction, view: HeadView) -> list[SessionRow]:
            parent = (await tx.heads([parent_uid]))[parent_uid]
            anchor = None
            if 0 < at_seq <= parent.seq and parent.exists and not parent.deleted:
                anchor = await tx.record_at(parent_uid, at_seq)
            taken = await tx.taken(uids)
            projection = rules.UNKNOWN_EXEC
            if at_seq == 0:
                projection = execstate.EMPTY
            elif at_seq == parent.seq and not parent.exec.unknown:
                projection = execstate.inherit(parent.exec)
            elif folded is not None and anchor is not None and anchor[1] == folded[1]:
                projection = folded[0]
            plan = rules.plan_fork(
                parent, at_seq, anchor, children, taken, prepared, time.time_ns(), projection
            )
            await tx.insert_sessions(plan.sessions)
            await tx.share_prefix(uids, parent_uid, at_seq)
            await tx.append_rows(plan.markers, (), time.time_ns())
            for new in plan.sessions:
                view.set(_head_of(new))
            return [new.row for new in plan.sessions]

        return await self.write("fork", program)

    async def import_records(self, row: SessionRow, records: Sequence[common_pb2.LogRecord]) -> SessionRow:
        """Create ``row`` holding ``records`` verbatim (stored hashes and fences), atomically.

        The records must run from seq 1 and link; their hashes are not recomputed (``verify`` does)."""
        rules.check_import_chain(row.uid, records)  # refused before anything is queued

        async def program(tx: Transaction, view: HeadView) -> SessionRow:
            taken = bool(await tx.taken([row.uid]))
            plan = rules.plan_import(row, records, taken, time.time_ns())
            await tx.insert_sessions([plan.session])
            await tx.append_rows(plan.records, (), time.time_ns())
            view.set(_head_of(plan.session))
            return plan.session.row

        return await self.write("import", program)

    # -- harness registry and tool receipts --------------------------------------------------

    async def put_harness(self, registration: harness_registry_pb2.HarnessRegistration) -> None:
        name = registration.metadata.name
        if not name:
            raise StoreError("put_harness: registration has no metadata.name")
        blob = registration.SerializeToString(deterministic=True)

        async def program(tx: Transaction, view: HeadView) -> None:
            await tx.put_harness(name, blob, time.time_ns())

        await self.write("put harness", program)

    async def get_harness(self, name: str) -> harness_registry_pb2.HarnessRegistration | None:
        self._check_open("get harness")
        blob = await self._dialect.get_harness(name)
        return None if blob is None else harness_registry_pb2.HarnessRegistration.FromString(blob)

    async def list_harnesses(self) -> list[harness_registry_pb2.HarnessRegistration]:
        self._check_open("list harnesses")
        return [
            harness_registry_pb2.HarnessRegistration.FromString(b)
            for b in await self._dialect.list_harnesses()
        ]

    async def get_tool_receipt(self, uid: str, idempotency_key: str) -> common_pb2.ToolResult | None:
        self._check_open("get tool receipt")
        blob = await self._dialect.get_tool_receipt(uid, idempotency_key)
        return None if blob is None else common_pb2.ToolResult.FromString(blob)

    async def put_tool_receipt(self, uid: str, idempotency_key: str, result: common_pb2.ToolResult) -> None:
        blob = result.SerializeToString(deterministic=True)

        async def program(tx: Transaction, view: HeadView) -> None:
            await tx.put_tool_receipt(uid, idempotency_key, blob, time.time_ns())

        await self.write("put tool receipt", program)

    async def session_uids(self) -> list[str]:
        self._check_open("list session uids")
        return await self._dialect.session_uids()


async def _apply_run(
    tx: Transaction, requests: list[AppendRequest | MintRequest], view: HeadView
) -> list[_Outcome]:
    """Consecutive appends and mints: one head lookup, one plan, one write."""
    heads: dict[str, SessionHead] = {}
    missing: dict[str, None] = {}  # ordered, without repeats
    for req in requests:
        uid = req.uid
        if uid in heads or uid in missing:
            continue
        head = view.get(uid)
        if head is None:
            missing[uid] = None
        else:
            heads[uid] = head
    if missing:
        view.reads += len(missing)
        for uid, head in (await tx.heads(list(missing))).items():
            heads[uid] = head
            view.set(head)
    now = time.time_ns()
    plan = rules.plan_run(requests, heads, now)
    if plan.created:
        await tx.insert_sessions(plan.created)
    if plan.rows or plan.moved:
        await tx.append_rows(plan.rows, list(plan.moved.values()), now)
    for head in plan.moved.values():
        view.moved(head, now)
    return plan.outcomes


def _head_of(new: rules.NewSession) -> SessionHead:
    row = new.row
    projection = row.exec_projection if row.exec_projection is not None else rules.UNKNOWN_EXEC
    return SessionHead(
        row.uid, True, False, new.fence, row.compute_state, row.last_seq, new.last_hash, projection
    )


async def _settle_in_turns(settled: Sequence[tuple[asyncio.Future[Any], _Outcome]]) -> None:
    """Wake a committed batch's writers ``SETTLE_PER_TURN`` at a time, one event-loop turn apart.

    Woken all at once, a batch of 200 writers runs their next steps in one loop turn of 20-90 ms,
    and every other callback waits behind all of them: a new call's acceptance, a listing's
    query, a watcher's record. In slices, whatever became ready meanwhile runs between them.
    The batch is durable before the first is woken; a cancellation between slices wakes the rest
    at once with their own outcomes."""
    try:
        for i, (future, outcome) in enumerate(settled):
            if i and not i % SETTLE_PER_TURN:
                await asyncio.sleep(0)
            _settle(future, outcome)
    finally:
        for future, outcome in settled:
            _settle(future, outcome)


def _settle(future: asyncio.Future[Any], outcome: Any) -> None:
    if future.done():  # the caller gave up waiting; the write stands regardless
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
