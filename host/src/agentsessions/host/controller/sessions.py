"""Session rows as the controller sees them: read with the caller's access checked, read as
executions (through the journal cache), viewed with their derived state; created, listed and
deleted. Every other concern reads sessions through here."""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller import compute
from agentsessions.host.controller.access import SessionAccess
from agentsessions.host.controller.drive import RunningTurns
from agentsessions.host.controller.errors import (
    ControllerError,
    InvalidArgumentError,
    InvalidExecutionLogError,
)
from agentsessions.host.controller.executions import Execution
from agentsessions.host.controller.guard import SessionGuards
from agentsessions.host.controller.harnesses import HarnessCatalog
from agentsessions.host.controller.journal_cache import JournalCache
from agentsessions.host.controller.state import SessionView, derive_view
from agentsessions.host.journal.store import (
    InvalidPageTokenError,
    JournalStore,
    SessionNotFoundError,
    SessionRow,
)
from agentsessions.v1 import common_pb2, session_pb2

# A session's journal as read: every event, and the executions they form (first-seen order).
Journal = tuple[list[common_pb2.Event], list[Execution]]


@dataclass(frozen=True)
class CreateParams:
    project: str = ""
    name: str = ""
    harness: str = ""
    model: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    origin: common_pb2.Origin | None = None
    identity: common_pb2.IdentityRef | None = None


def new_session_uid() -> str:
    return "sess-" + secrets.token_hex(12)


class Sessions:
    """Rows, journals and views of sessions, and their create/list/delete."""

    def __init__(
        self,
        store: JournalStore,
        cache: JournalCache,
        catalog: HarnessCatalog,
        access: SessionAccess,
        guards: SessionGuards,
        running: RunningTurns,
        *,
        default_project: str,
        purge_on_delete: bool,
    ) -> None:
        self._store = store
        self._cache = cache
        self._catalog = catalog
        self._access = access
        self._guards = guards
        self._running = running
        self.default_project = default_project
        self._purge = purge_on_delete

    async def row(self, call: CallContext, uid: str) -> SessionRow:
        """The session's row; SessionNotFoundError, or an access refusal for the caller."""
        row = await self._store.get_session(uid)
        if row is None:
            raise SessionNotFoundError(f"session {uid!r} not found")
        self._access.check_project(call, row.project)
        return row

    async def visible(self, call: CallContext, uid: str) -> bool:
        """Whether ``uid``'s records may be streamed. A session without a visible row (unknown,
        or deleted with its rows kept for audit) has no records to show (False); one in a project
        the caller may not use is refused."""
        row = await self._store.get_session(uid)
        if row is None:
            return False
        self._access.check_project(call, row.project)
        return True

    async def read(self, row: SessionRow) -> Journal:
        """The session's events and executions (InvalidExecutionLogError when malformed)."""
        return await self._cache.executions(row.uid, row.fork_seq)

    async def events(self, uid: str) -> list[common_pb2.Event]:
        return await self._cache.events(uid)

    async def view(self, row: SessionRow, journal: Journal | None = None) -> SessionView:
        """The row's derived view; ``journal`` is the session as the caller has just read it."""
        if row.last_seq == 0:
            return SessionView(row, session_pb2.EXEC_PENDING)
        try:
            events, executions = journal if journal is not None else await self.read(row)
        except InvalidExecutionLogError:
            return SessionView(row, session_pb2.EXEC_FAILED)
        return derive_view(row, events, executions, running_here=row.uid in self._running)

    async def look(self, call: CallContext, uid: str) -> SessionView:
        """The session's view as the journal has it now."""
        return await self.view(await self.row(call, uid))

    async def create(self, call: CallContext, p: CreateParams) -> SessionView:
        resolved = await self._catalog.resolve(p.harness, for_new_session=True)
        project = p.project or self.default_project
        self._access.check_project(call, project)
        identity = self._access.actor(call, p.identity)
        now = time.time_ns()
        row = SessionRow(
            uid=new_session_uid(),
            project=project,
            name=p.name,
            harness=resolved.name,
            model=p.model,
            labels=dict(p.labels),
            annotations=dict(p.annotations),
            origin=p.origin,
            identity=identity,
            create_time_ns=now,
            update_time_ns=now,
        )
        stored = await self._store.create_session(row)
        return SessionView(stored, session_pb2.EXEC_PENDING)

    async def list(
        self, call: CallContext, project: str, page_size: int, token: str
    ) -> tuple[list[SessionView], str]:
        """A page of the project's sessions (the store bounds the page size)."""
        project = project or self.default_project
        self._access.check_project(call, project)
        try:
            rows, next_token = await self._store.list_sessions(project, page_size, token)
        except InvalidPageTokenError as exc:
            raise InvalidArgumentError("page_token", "is not a token this host issued") from exc
        return [await self.view(r) for r in rows], next_token

    async def delete(self, call: CallContext, uid: str) -> SessionView:
        """Delete an idle session (waiting, bounded, for an ending operation) and release its
        compute; the view it had."""
        async with self._guards.hold_when_free(uid):
            row = await self.row(call, uid)
            view = await self.view(row)
            await self._store.delete_session(uid, purge=self._purge)
            self._cache.forget(uid)
        try:
            resolved = await self._catalog.resolve(row.harness)
        except ControllerError:
            return view  # a harness this host no longer serves holds no compute here
        await compute.release_all(resolved, [uid])
        return view
