"""The per-session guard: one operation at a time on a session, on this host.

Exec, Suspend, Resume, Approve and the closing of a parked turn hold the guard; a second one
arriving meanwhile is refused (SessionBusyError, ABORTED), or, for DeleteSession, waits a bounded
time for the ending operation to let go. Across hosts the fence and the journal's CAS do this job.
Cancel arriving while the holder has no turn driven yet (an Exec in its Describe, say) arms a
cancel on the hold (:class:`ArmedCancel`): the turn the holder drives next ends CANCELED at once,
and the arming goes with the hold. A hold taken by the host's own recovery says so
(``hold(uid, recovery=True)``): a Resume that finds it waits for it instead of being refused.
The table holds an entry only while someone holds or awaits a session, so it does not grow with
the sessions a host has ever served.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import field

from agentsessions.host.controller.errors import SessionBusyError
from agentsessions.sdk.structs import struct


@struct
class ArmedCancel:
    """A Cancel that found the session held with no turn driven: the holder's next turn ends
    CANCELED before its harness runs (``execution_id``: only that one)."""

    reason: str
    execution_id: str = ""
    taken: str = ""  # the execution it cancelled, once a turn was driven

    def take(self, execution_id: str) -> str | None:
        """The cancel reason for the turn about to be driven, if this cancel means it."""
        if self.taken or (self.execution_id and self.execution_id != execution_id):
            return None
        self.taken = execution_id
        return self.reason


@struct
class _Slot:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0  # holders and waiters; the slot is dropped when it reaches 0
    cancel: ArmedCancel | None = None  # armed for the current holder only (cleared as it lets go)
    recovery: bool = False  # the current holder is the host's own recovery of the session


class SessionGuards:
    """Guards by session uid; ``wait_bound_s`` bounds :meth:`hold_when_free`."""

    def __init__(self, wait_bound_s: float) -> None:
        self._wait_bound_s = wait_bound_s
        self._slots: dict[str, _Slot] = {}

    def __len__(self) -> int:
        """Sessions held or awaited right now."""
        return len(self._slots)

    def busy(self, uid: str) -> bool:
        slot = self._slots.get(uid)
        return slot is not None and slot.lock.locked()

    def recovering(self, uid: str) -> bool:
        """Whether the host's own recovery holds ``uid`` right now."""
        slot = self._slots.get(uid)
        return slot is not None and slot.lock.locked() and slot.recovery

    def users(self, uid: str) -> int:
        """Holders and waiters of ``uid`` right now."""
        slot = self._slots.get(uid)
        return 0 if slot is None else slot.users

    def arm_cancel(self, uid: str, reason: str, execution_id: str = "") -> ArmedCancel | None:
        """Arm a cancel on the current hold of ``uid`` (None: nobody holds it)."""
        slot = self._slots.get(uid)
        if slot is None or not slot.lock.locked():
            return None
        if slot.cancel is None:
            slot.cancel = ArmedCancel(reason, execution_id)
        return slot.cancel

    def armed(self, uid: str) -> ArmedCancel | None:
        """The cancel armed on the current hold of ``uid``, if any."""
        slot = self._slots.get(uid)
        return slot.cancel if slot is not None else None

    def hold(self, uid: str, *, recovery: bool = False) -> AbstractAsyncContextManager[None]:
        """Hold the session's guard; SessionBusyError when another operation holds it.
        ``recovery``: the holder is the host's own recovery of the session."""
        if self.busy(uid):
            raise SessionBusyError(uid)
        return _Held(self, uid, recovery)

    @contextlib.asynccontextmanager
    async def hold_when_free(self, uid: str, bound_s: float | None = None) -> AsyncIterator[None]:
        """Hold the guard, waiting (bounded: ``bound_s``, else the guards' own bound) for an ending
        operation to let go."""
        async with self._using(uid) as slot:
            try:
                async with asyncio.timeout(self._wait_bound_s if bound_s is None else bound_s):
                    await slot.lock.acquire()
            except TimeoutError:
                raise SessionBusyError(uid) from None
            try:
                yield
            finally:
                slot.cancel = None
                slot.lock.release()

    @contextlib.asynccontextmanager
    async def _using(self, uid: str) -> AsyncIterator[_Slot]:
        slot = self.enter(uid)
        try:
            yield slot
        finally:
            self.leave(uid, slot)

    def enter(self, uid: str) -> _Slot:
        """Count a holder or waiter of ``uid``'s slot (made when there is none)."""
        slot = self._slots.get(uid)
        if slot is None:
            slot = self._slots[uid] = _Slot()
        slot.users += 1
        return slot

    def leave(self, uid: str, slot: _Slot) -> None:
        """The holder or waiter is gone; the slot goes with its last one."""
        slot.users -= 1
        if slot.users == 0:
            del self._slots[uid]


class _Held:
    """Holding one session's guard (every Exec takes one: a class, not a generator, for its cost)."""

    def __init__(self, guards: SessionGuards, uid: str, recovery: bool = False) -> None:
        self._guards = guards
        self._uid = uid
        self._recovery = recovery
        self._slot: _Slot | None = None

    async def __aenter__(self) -> None:
        slot = self._slot = self._guards.enter(self._uid)
        try:
            await slot.lock.acquire()
        except BaseException:
            self._guards.leave(self._uid, slot)
            raise
        slot.recovery = self._recovery

    async def __aexit__(self, *exc_info: object) -> None:
        slot = self._slot
        assert slot is not None
        slot.cancel = None
        slot.recovery = False
        slot.lock.release()
        self._guards.leave(self._uid, slot)
