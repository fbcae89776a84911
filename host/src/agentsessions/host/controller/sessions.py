"""Session rows as the controller sees them: read with the caller's access checked, read as
executions (through the journal cache), viewed with their derived state; created, listed and
deleted. Every other concern reads sessions through here."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller import compute
from agentsessions.host.controller.core import Core
from agentsessions.host.controller.errors import (
    ControllerError,
    InvalidArgumentError,
    InvalidExecutionLogError,
    PermissionDeniedError,
)
from agentsessions.host.controller.executions import Execution
from agentsessions.host.controller.state import SessionView, derive_view, projected_view
from agentsessions.host.ids import token_hex
from agentsessions.host.journal.store import (
    COMPUTE_NONE,
    Head,
    InvalidPageTokenError,
    SessionNotFoundError,
    SessionRow,
)
from agentsessions.sdk.modes import MODE_ANNOTATION, MODES, strictest
from agentsessions.v1 import common_pb2, session_pb2

# A session's journal as read: every event, and the executions they form (first-seen order).
Journal = tuple[Sequence[common_pb2.Event], list[Execution]]


def new_session_uid() -> str:
    return "sess-" + token_hex(12)


async def row(core: Core, call: CallContext, uid: str) -> SessionRow:
    """The session's row; SessionNotFoundError, also for a session in a project the caller may
    not use: to such a caller it answers exactly as an unknown uid does, so neither its existence
    nor its project leaks (UnauthenticatedError still comes first)."""
    core.access.check_caller(call)
    found = await core.store.get_session(uid)
    if found is None or not _may_see(core, call, found.project):
        raise SessionNotFoundError(f"session {uid!r} not found")
    return found


async def visible(core: Core, call: CallContext, uid: str) -> bool:
    """Whether ``uid``'s records may be streamed. A session without a visible row (unknown,
    deleted with its rows kept for audit, or in a project the caller may not use) has no records
    to show (False)."""
    core.access.check_caller(call)
    found = await core.store.get_session(uid)
    return found is not None and _may_see(core, call, found.project)


def _may_see(core: Core, call: CallContext, project: str) -> bool:
    try:
        core.access.check_project(call, project)
    except PermissionDeniedError:
        return False
    return True


async def read(core: Core, session: SessionRow, *, fresh: bool = False) -> Journal:
    """The session's events and executions (InvalidExecutionLogError when malformed). ``fresh``:
    the row was read just now, so the head it carries vouches for the cached journal."""
    head = None
    if fresh and (session.last_hash or session.last_seq == 0):
        head = Head(session.last_seq, session.last_hash)
    return await core.cache.executions(session.uid, session.fork_seq, head)


async def view(core: Core, session: SessionRow, journal: Journal | None = None) -> SessionView:
    """The row's derived view; ``journal`` is the session as the caller has just read it. Without
    one, the execution state the row projects is used, and the journal is read only for a row
    whose projection is missing or could not be kept (``journal.execstate``)."""
    if session.last_seq == 0:
        return SessionView(session, session_pb2.EXEC_PENDING)
    projection = session.exec_projection
    if journal is None and projection is not None and not projection.unknown:
        return projected_view(session, projection, running_here=session.uid in core.driver.running)
    try:
        events, executions = journal if journal is not None else await read(core, session)
    except InvalidExecutionLogError:
        return SessionView(session, session_pb2.EXEC_FAILED)
    return derive_view(session, events, executions, running_here=session.uid in core.driver.running)


async def look(core: Core, call: CallContext, uid: str) -> SessionView:
    """The session's view as the journal has it now."""
    return await view(core, await row(core, call, uid))


async def create(core: Core, call: CallContext, requested: SessionRow) -> SessionView:
    """A new session from what the caller may set on ``requested`` (project, name, harness,
    model, labels, annotations, origin, identity); uid (unless the host planned one on
    ``requested``), times and derived fields are the host's."""
    resolved = await core.catalog.resolve(requested.harness, for_new_session=True)
    project = requested.project or core.default_project
    core.access.check_project(call, project)
    annotations = dict(requested.annotations)
    asked = annotations.get(MODE_ANNOTATION, "")
    if asked and asked not in MODES:
        raise InvalidArgumentError(
            f"session.annotations[{MODE_ANNOTATION!r}]", f"must be one of {', '.join(MODES)}, got {asked!r}"
        )
    # The session's mode, fixed now: what the creator asked, or stricter where the project requires.
    mode = strictest(asked, core.policy.mode_for(project))
    if mode:
        annotations[MODE_ANNOTATION] = mode
    now = time.time_ns()
    fresh = dataclasses.replace(
        requested,
        uid=requested.uid or new_session_uid(),
        project=project,
        harness=resolved.name,
        labels=dict(requested.labels),
        annotations=annotations,
        identity=core.access.actor(call, requested.identity),
        parent_uid="",
        fork_seq=0,
        create_time_ns=now,
        update_time_ns=now,
        compute_state=COMPUTE_NONE,
        last_seq=0,
    )
    stored = await core.store.create_session(fresh)
    return SessionView(stored, session_pb2.EXEC_PENDING)


async def page(
    core: Core, call: CallContext, project: str, page_size: int, token: str
) -> tuple[list[SessionView], str]:
    """A page of the project's sessions (the store bounds the page size)."""
    project = project or core.default_project
    core.access.check_project(call, project)
    try:
        rows, next_token = await core.store.list_sessions(project, page_size, token)
    except InvalidPageTokenError as exc:
        raise InvalidArgumentError("page_token", "is not a token this host issued") from exc
    await core.listing.take(len(rows))  # listing yields to turns under load (pacing.py)
    return [await view(core, r) for r in rows], next_token


async def delete(core: Core, call: CallContext, uid: str) -> SessionView:
    """Delete an idle session (waiting, bounded, for an ending operation), release its compute;
    the view it had."""
    async with core.guards.hold_when_free(uid):
        session = await row(core, call, uid)
        before = await view(core, session)
        await core.store.delete_session(uid, purge=core.purge_on_delete)
        core.cache.forget(uid)
    try:
        resolved = await core.catalog.resolve(session.harness)
    except ControllerError:
        return before  # a harness this host no longer serves holds no compute here
    await compute.release_all(resolved, [uid])
    return before
