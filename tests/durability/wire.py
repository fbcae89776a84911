"""What durability tests read off the wire and the journal: records, kinds, hashes, requests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from agentsessions.host.journal import canon, open_store
from agentsessions.host.journal.store import JournalStore
from agentsessions.v1 import common_pb2, session_pb2
from tests.support.host import HostUnderTest, text_input

K = common_pb2.EventKind
LK = common_pb2.Lifecycle.Kind


def records(updates: list[session_pb2.ExecUpdate]) -> list[common_pb2.LogRecord]:
    return [u.record for u in updates if u.WhichOneof("update") == "record"]


def kinds(recs: list[common_pb2.LogRecord]) -> list[str]:
    names = []
    for r in recs:
        name = K.Name(r.event.kind)
        if r.event.kind == K.EVENT_LIFECYCLE:
            name += ":" + LK.Name(r.event.lifecycle.kind)
        names.append(name)
    return names


def text_of(rec: common_pb2.LogRecord) -> str:
    return "".join(p.text.text for p in rec.event.message.parts)


def say(session: str, *texts: str, **fields: object) -> session_pb2.ExecRequest:
    return session_pb2.ExecRequest(session=session, inputs=[text_input(t) for t in texts], **fields)  # type: ignore[arg-type]


async def new_session(host: HostUnderTest, harness: str, **meta: object) -> str:
    s = session_pb2.Session(harness=harness, **meta)  # type: ignore[arg-type]
    created = await host.sessions.CreateSession(session_pb2.CreateSessionRequest(session=s))
    uid: str = created.metadata.uid
    return uid


async def get(host: HostUnderTest, uid: str) -> session_pb2.Session:
    got: session_pb2.Session = await host.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid))
    return got


async def chain(store: JournalStore, uid: str) -> list[tuple[int, str, str]]:
    """(seq, prev_hash, content_hash) of every stored record: equal lists mean an unchanged journal."""
    return [(r.seq, r.prev_hash, r.content_hash) for r in await store.read(uid)]


async def append_raw(
    store: JournalStore, uid: str, events: list[common_pb2.Event]
) -> list[common_pb2.LogRecord]:
    """Append events at the head as a writer that then crashed would have left them."""
    head = await store.head(uid)
    fence = await store.new_fence(uid)
    return await store.append(
        uid, [canon.normalize_event(e) for e in events], expected_head=head.seq, fence=fence
    )


@contextlib.asynccontextmanager
async def journal_at(path: Path) -> AsyncIterator[JournalStore]:
    """The SQLite journal at ``path``, opened for the block and closed after it."""
    store = await open_store(str(path))
    try:
        yield store
    finally:
        await store.close()
