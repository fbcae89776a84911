"""Execution leases: which host runs an execution, kept in the journal store beside the journal.

A new turn's lease is written in the transaction of its EXECUTION_START (``admission.py``); a
re-drive (Resume, automatic recovery) takes the lease before it runs. While this host drives an
execution, :class:`LeaseKeeper` renews the expiry of every lease it owns in one statement, and
hands it the cancel requests other hosts left on them. How the drive ends decides what becomes of
the lease (:class:`LeasedDriver`): END or Cancel drops it; a park leaves it ``parked`` (the
recoverer resumes the turn once the gate is decided); a failure (ERROR journaled) or a drain
leaves it for the next attempt (``retry``, with backoff); a caller that went away from a plain
Exec drops it (the reference's behaviour: the turn stays interrupted until someone Resumes it).

An owner is ``<hostname>/<pid namespace>/<pid>/<nonce>``, so a host can tell that a lease belongs
to a process of its own machine that is gone (``Owner.is_dead``) and take it at once, instead of
waiting for the expiry a lease of another machine needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Final

from agentsessions.host import logs
from agentsessions.host.controller.drive import Driver, RunningTurns, cancelled
from agentsessions.host.controller.errors import (
    ConcurrencyError,
    ExecutionCancelled,
    InvalidExecutionLogError,
    ReplayDivergedError,
)
from agentsessions.host.controller.harnesses import ResolvedHarness
from agentsessions.host.controller.sink import ExecutionSink
from agentsessions.host.controller.writer import ExecutionWriter
from agentsessions.host.journal.feed import CancelRequested, FeedItem
from agentsessions.host.journal.live import PARKED, RETRY, RUNNING, Lease, LiveStore
from agentsessions.host.journal.store import StoreError
from agentsessions.sdk.harness import Start
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

log = logging.getLogger("agentsessions.controller")

DEFAULT_LEASE_TTL_S: Final = 15.0
# Ended executions whose leases wake the renewal early, to be dropped in one transaction.
FINISHED_BATCH: Final = 256
DRAIN_REASON: Final = "the host shut down during the turn; another attempt recovers it"


@struct(frozen=True)
class Owner:
    """Who holds a lease: this process, named so its own machine can tell when it is gone."""

    name: str
    prefix: str  # "<hostname>/<pid namespace>/": processes of one machine share it

    @classmethod
    def of_this_process(cls) -> Owner:
        try:
            namespace = os.readlink("/proc/self/ns/pid")
        except OSError:
            namespace = ""
        # Without a pid namespace a pid says nothing certain: no lease is ever judged dead by it.
        prefix = (
            f"{socket.gethostname()}/{namespace}/"
            if namespace
            else f"{socket.gethostname()}/?{secrets.token_hex(4)}/"
        )
        return cls(f"{prefix}{os.getpid()}/{secrets.token_hex(4)}", prefix)

    def is_dead(self, other: str) -> bool:
        """Whether ``other`` names a process of this machine that no longer runs (a blocking
        look at /proc: call it off the event loop)."""
        if other == self.name or not other.startswith(self.prefix) or "?" in self.prefix:
            return False
        pid_text, _, _ = other[len(self.prefix) :].partition("/")
        try:
            pid = int(pid_text)
        except ValueError:
            return False
        if pid == os.getpid():
            return True  # this pid, another nonce: an earlier incarnation that had this pid
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                state = stat.read().rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            return True
        return state in (b"Z", b"X")  # a zombie's leases are as dead as it is


@struct(frozen=True)
class LeaseSettings:
    ttl_s: float = DEFAULT_LEASE_TTL_S
    recover: bool = True  # off: failed turns are left for Resume (no retry lease)
    backoff_s: float = 1.0  # before the first retry; doubled for each one after it
    max_backoff_s: float = 60.0

    @property
    def ttl_ns(self) -> int:
        return int(self.ttl_s * 1e9)

    def backoff_ns(self, attempts: int) -> int:
        return int(min(self.max_backoff_s, self.backoff_s * 2 ** max(0, attempts)) * 1e9)


class LeaseKeeper:
    """The leases this host owns: taken, renewed, ended, and the cancel requests found on them."""

    def __init__(
        self,
        live: LiveStore,
        running: RunningTurns,
        settings: LeaseSettings,
        *,
        owner: Owner | None = None,
        cancel_grace_s: float = 5.0,
    ) -> None:
        self.live = live
        self.running = running
        self.settings = settings
        self.owner = owner or Owner.of_this_process()
        self._cancel_grace_s = cancel_grace_s
        self.owned: set[tuple[str, str]] = set()  # (session, execution) driven here
        # Ended here, lease not yet dropped: dropped with the next renewal, in its transaction, so
        # a turn's END costs no commit of its own (a lease left behind names an execution with an
        # END, which anyone who finds it drops).
        self.finished: set[tuple[str, str]] = set()
        self.draining = False
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._stopping: set[asyncio.Task[None]] = set()
        # Called when an execution of a session ended here (the queue runner starts the next turn).
        self.on_ended: Callable[[str], None] = lambda uid: None
        live.feed.listen(self._heard)

    def fresh(self, uid: str, execution_id: str, attempts: int = 0) -> Lease:
        """A RUNNING lease of this host, expiring one TTL from now."""
        expires = time.time_ns() + self.settings.ttl_ns
        return Lease(uid, execution_id, RUNNING, self.owner.name, expires, attempts)

    def held(self, uid: str, execution_id: str) -> bool:
        return (uid, execution_id) in self.owned

    async def live_elsewhere(self, lease: Lease) -> bool:
        """A RUNNING lease another process holds and renews: not expired, and not of a process
        of this machine that is gone."""
        if lease.state != RUNNING or lease.owner == self.owner.name:
            return False
        if lease.expires_at_ns <= time.time_ns():
            return False
        return not await asyncio.to_thread(self.owner.is_dead, lease.owner)

    # -- renewal ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._keep())

    async def close(self) -> None:
        await cancelled((self._task,))
        self._task = None
        if self._stopping:
            await asyncio.wait(list(self._stopping), timeout=self._cancel_grace_s)
        with contextlib.suppress(StoreError):
            await self.renew()  # the leases of what ended here go now

    def _heard(self, uid: str, item: FeedItem) -> None:
        if isinstance(item, CancelRequested) and self.held(uid, item.execution_id):
            self._wake.set()

    async def _keep(self) -> None:
        period = max(0.05, self.settings.ttl_s / 3)
        while True:
            self._wake.clear()
            try:
                await self.renew()
            except Exception:  # a lease not renewed is taken over elsewhere: renewal must go on
                log.exception("lease renewal failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(period):
                    await self._wake.wait()

    async def renew(self) -> None:
        """One renewal: drop the leases of what ended here, extend the rest, act on cancel requests."""
        if not self.owned and not self.finished:
            return
        finished = list(self.finished)
        try:
            renewed = await self.live.renew(self.owner.name, self.settings.ttl_ns, finished)
        except StoreError as exc:
            log.warning("lease renewal failed", extra=logs.fields(error=type(exc).__name__))
            return
        self.finished.difference_update(finished)
        for lease in renewed:
            if lease.cancel_reason is not None:
                self._cancel(lease)

    def _cancel(self, lease: Lease) -> None:
        turn = self.running.get(lease.session)
        if turn is None or turn.execution_id != lease.execution_id or turn.cancel_reason is not None:
            return
        stopping = asyncio.get_running_loop().create_task(
            turn.stop(lease.cancel_reason or "cancelled by request", self._cancel_grace_s)
        )
        self._stopping.add(stopping)
        stopping.add_done_callback(self._stopping.discard)

    def drain(self) -> None:
        """The host is shutting down: turns cut from now on are left for another attempt."""
        self.draining = True
        for _, turn in self.running.all():
            if turn.interrupt_reason is None:
                turn.interrupt_reason = DRAIN_REASON

    # -- what becomes of a lease ---------------------------------------------------------------

    async def _quietly(self, what: str, write: Callable[[], Awaitable[object]]) -> None:
        # A lease write that fails leaves the lease to expire: recovery then takes the turn.
        with contextlib.suppress(StoreError):
            await write()
            return
        log.warning("lease write failed", extra=logs.fields(step=what))

    async def take(self, uid: str, execution_id: str) -> None:
        """Before a re-drive this host was not handed a lease for (a Resume): own it now."""
        if self.held(uid, execution_id):
            return
        self.owned.add((uid, execution_id))

        async def write() -> None:
            current = await self.live.lease(uid, execution_id)
            attempts = current.attempts if current is not None else 0
            await self.live.put_lease(self.fresh(uid, execution_id, attempts=attempts))

        await self._quietly("take", write)

    def adopted(self, uid: str, execution_id: str) -> None:
        """The lease was written for this host (with the EXECUTION_START, or by a claim)."""
        self.owned.add((uid, execution_id))

    def _forget(self, uid: str, execution_id: str) -> None:
        self.owned.discard((uid, execution_id))
        self.on_ended(uid)

    async def ended(self, uid: str, execution_id: str) -> None:
        """END (or Cancel) is journaled: nothing is left to recover. The lease goes with the next
        renewal (``finished``), so the session is free at once and the END costs no commit."""
        self._forget(uid, execution_id)
        self.finished.add((uid, execution_id))
        if len(self.finished) >= FINISHED_BATCH:
            self._wake.set()

    async def parked(self, uid: str, execution_id: str, seen_seq: int) -> None:
        """The turn waits at an approval gate: recovered once the gate is decided."""
        self._forget(uid, execution_id)
        lease = Lease(uid, execution_id, PARKED, "", 0, seen_seq=seen_seq)
        await self._quietly("park", lambda: self.live.release(lease, self.owner.name))

    async def failed(self, uid: str, execution_id: str, error: str, *, final: bool = False) -> None:
        """The attempt failed and its ERROR is journaled: another attempt after a backoff (or,
        with recovery off or a failure no retry can mend, the turn is left for Resume)."""
        self._forget(uid, execution_id)
        if final or not self.settings.recover:
            await self._quietly("drop", lambda: self.live.drop_lease(uid, execution_id, self.owner.name))
            return

        async def write() -> None:
            current = await self.live.lease(uid, execution_id)
            attempts = current.attempts if current is not None else 0
            due = time.time_ns() + self.settings.backoff_ns(attempts)
            retry = Lease(uid, execution_id, RETRY, "", 0, attempts, due, last_error=error[:2000])
            await self.live.release(retry, self.owner.name)

        await self._quietly("retry", write)

    async def interrupted(self, uid: str, execution_id: str) -> None:
        """The drive's task was cut: by the drain (another attempt at once) or by a caller that
        went away (the lease goes: the reference leaves that turn to Resume)."""
        self._forget(uid, execution_id)
        if self.draining and self.settings.recover:
            retry = Lease(uid, execution_id, RETRY, "", 0, next_at_ns=0, last_error=DRAIN_REASON)

            async def write() -> None:
                current = await self.live.lease(uid, execution_id)
                attempts = current.attempts if current is not None else 0
                await self.live.release(dataclasses.replace(retry, attempts=attempts), self.owner.name)

            await self._quietly("retry", write)
            return
        await self._quietly("drop", lambda: self.live.drop_lease(uid, execution_id, self.owner.name))

    def lost(self, uid: str, execution_id: str) -> None:
        """Another writer superseded this one (a fence): the lease is theirs now."""
        self._forget(uid, execution_id)


# Failures no other attempt can mend: the journal's shape decides them.
_FINAL = (ReplayDivergedError, InvalidExecutionLogError)


class LeasedDriver(Driver):
    """The Driver, with the lease of each execution it drives taken and ended."""

    def __init__(self, running: RunningTurns, keeper: LeaseKeeper) -> None:
        super().__init__(running)
        self.keeper = keeper

    async def drive(
        self,
        uid: str,
        resolved: ResolvedHarness,
        start: Start,
        sink: ExecutionSink,
        writer: ExecutionWriter,
        deadline_unix: int = 0,
    ) -> common_pb2.LogRecord | None:
        keeper = self.keeper
        execution_id = start.execution_id
        await keeper.take(uid, execution_id)
        try:
            parked = await super().drive(uid, resolved, start, sink, writer, deadline_unix)
        except ExecutionCancelled:
            await keeper.ended(uid, execution_id)
            raise
        except ConcurrencyError:
            keeper.lost(uid, execution_id)
            raise
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await asyncio.shield(keeper.interrupted(uid, execution_id))
            raise
        except Exception as exc:
            await keeper.failed(uid, execution_id, str(exc), final=isinstance(exc, _FINAL))
            raise
        if parked is not None:
            await keeper.parked(uid, execution_id, parked.seq)
        else:
            await keeper.ended(uid, execution_id)
        return parked
