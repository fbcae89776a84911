"""PostgreSQL-only behaviour: several processes on one database, migrations, driver errors.

The shared store semantics run in test_store_conformance.py (param "postgres"); these tests
cover what only a shared database server can get wrong.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from agentsessions.host.journal import execstate, postgres
from agentsessions.host.journal.postgres import PostgresStore, PostgresURLError
from agentsessions.host.journal.store import (
    ConflictError,
    FencedError,
    SchemaError,
    SessionRow,
    StoreError,
    TamperedError,
)
from agentsessions.v1 import common_pb2
from tests.journal.journals import parked_turn
from tests.journal.pg import pg_server, pg_url

__all__ = ["pg_server", "pg_url"]

pytestmark = pytest.mark.postgres

# Generous bound on any one reply from a worker process (they answer in milliseconds).
REPLY_TIMEOUT_S = 60.0

# A separate host process: opens its own PostgresStore and obeys one JSON command per line.
WORKER = r"""
import asyncio, json, sys
from agentsessions.host.journal.postgres import PostgresStore
from agentsessions.host.journal.store import StoreError
from agentsessions.v1 import common_pb2


def text_event(text):
    return common_pb2.Event(
        kind=common_pb2.EVENT_INPUT,
        message=common_pb2.Message(role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text=text))]),
    )


async def main(url):
    store = await PostgresStore.open(url, pool_size=2)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    while line := await reader.readline():
        cmd = json.loads(line)
        try:
            if cmd["op"] == "new_fence":
                reply = {"fence": await store.new_fence(cmd["uid"])}
            else:
                records = await store.append(
                    cmd["uid"], [text_event(cmd["text"])], expected_head=cmd["expected"], fence=cmd["fence"]
                )
                reply = {"seq": records[0].seq, "hash": records[0].content_hash}
        except StoreError as exc:
            reply = {"error": type(exc).__name__, "message": str(exc)}
        except Exception as exc:
            kind = type(exc)
            reply = {"error": f"raw {kind.__module__}.{kind.__qualname__}", "message": str(exc)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    await store.close()


asyncio.run(main(sys.argv[1]))
"""


class Worker:
    """One host process driven over its stdin/stdout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, url: str) -> Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            WORKER,
            url,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        worker = cls(proc)
        ready = await worker.reply()
        assert ready == {"ready": True}
        return worker

    def send(self, **command: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(command) + "\n").encode())

    async def reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), REPLY_TIMEOUT_S)
        if not line:
            assert self.proc.stderr is not None
            err = await asyncio.wait_for(self.proc.stderr.read(), REPLY_TIMEOUT_S)
            raise AssertionError(f"worker exited: {err.decode(errors='replace')}")
        decoded: dict[str, Any] = json.loads(line)
        return decoded

    async def call(self, **command: Any) -> dict[str, Any]:
        self.send(**command)
        return await self.reply()

    async def stop(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), REPLY_TIMEOUT_S)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


@pytest.fixture
async def workers(pg_url: str) -> AsyncIterator[Callable[[int], Awaitable[list[Worker]]]]:
    started: list[Worker] = []

    async def start(n: int) -> list[Worker]:
        batch = await asyncio.gather(*(Worker.start(pg_url) for _ in range(n)))
        started.extend(batch)
        return list(batch)

    try:
        yield start
    finally:
        await asyncio.gather(*(w.stop() for w in started))


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[PostgresStore]:
    opened = await PostgresStore.open(pg_url)
    try:
        yield opened
    finally:
        await opened.close()


def text_event(text: str) -> common_pb2.Event:
    return common_pb2.Event(
        kind=common_pb2.EVENT_INPUT,
        message=common_pb2.Message(role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text=text))]),
    )


def record_text(record: common_pb2.LogRecord) -> str:
    """The text of an INPUT record; "" for records without a message (such as markers)."""
    parts = record.event.message.parts
    return parts[0].text.text if parts else ""


async def test_processes_racing_for_one_seq_exactly_one_wins(
    store: PostgresStore, workers: Callable[[int], Awaitable[list[Worker]]]
) -> None:
    await store.create_session(SessionRow(uid="sess-race", project="p"))
    racers = await workers(4)
    for round_no in range(8):
        for i, worker in enumerate(racers):
            worker.send(op="append", uid="sess-race", expected=round_no, fence=0, text=f"r{round_no}w{i}")
        replies = [await w.reply() for w in racers]
        winners = [i for i, r in enumerate(replies) if "seq" in r]
        assert len(winners) == 1, replies
        losers = [r for r in replies if "seq" not in r]
        assert all(r["error"] == "ConflictError" for r in losers), losers
        assert replies[winners[0]]["seq"] == round_no + 1
        stored = await store.read("sess-race", round_no + 1, round_no + 1)
        assert [record_text(r) for r in stored] == [f"r{round_no}w{winners[0]}"]
        assert stored[0].content_hash == replies[winners[0]]["hash"]
    assert await store.verify("sess-race") == 8
    assert (await store.head("sess-race")).seq == 8


async def test_superseded_fence_is_refused_across_processes(
    store: PostgresStore, workers: Callable[[int], Awaitable[list[Worker]]]
) -> None:
    await store.create_session(SessionRow(uid="sess-fence", project="p"))
    old, new = await workers(2)
    old_fence = (await old.call(op="new_fence", uid="sess-fence"))["fence"]
    first = await old.call(op="append", uid="sess-fence", expected=0, fence=old_fence, text="old writer")
    assert first["seq"] == 1
    new_fence = (await new.call(op="new_fence", uid="sess-fence"))["fence"]
    assert new_fence > old_fence
    # The superseded writer is refused even though its CAS point is right.
    stale = await old.call(op="append", uid="sess-fence", expected=1, fence=old_fence, text="stale")
    assert stale["error"] == "FencedError", stale
    took_over = await new.call(op="append", uid="sess-fence", expected=1, fence=new_fence, text="new writer")
    assert took_over["seq"] == 2
    records = await store.read("sess-fence")
    assert [(r.fence, record_text(r)) for r in records] == [
        (old_fence, "old writer"),
        (new_fence, "new writer"),
    ]


async def test_a_replicas_row_is_read_afresh_after_another_replica_wrote(
    store: PostgresStore, workers: Callable[[int], Awaitable[list[Worker]]]
) -> None:
    # Replicas share the database: a row is never answered from memory (SQLite's single-writer
    # row memory is off here), so the other replica's append shows at once.
    await store.create_session(SessionRow(uid="sess-row", project="p"))
    await store.append("sess-row", [text_event("mine")], expected_head=0, fence=0)
    mine = await store.get_session("sess-row")
    assert mine is not None and mine.last_seq == 1
    (other,) = await workers(1)
    assert (await other.call(op="append", uid="sess-row", expected=1, fence=0, text="theirs"))["seq"] == 2
    seen = await store.get_session("sess-row")
    assert seen is not None and seen.last_seq == 2
    assert store.stats.row_hits == 0


async def test_racing_fence_mints_are_all_distinct(
    store: PostgresStore, workers: Callable[[int], Awaitable[list[Worker]]]
) -> None:
    await store.create_session(SessionRow(uid="sess-mint", project="p"))
    minters = await workers(3)
    for w in minters:
        w.send(op="new_fence", uid="sess-mint")
    for w in minters:
        w.send(op="new_fence", uid="sess-mint")
    fences = [(await w.reply())["fence"] for w in minters for _ in range(2)]
    assert sorted(fences) == [1, 2, 3, 4, 5, 6]


async def test_migrations_are_idempotent_on_reopen(pg_url: str) -> None:
    first = await PostgresStore.open(pg_url)
    await first.create_session(SessionRow(uid="sess-keep", project="p"))
    await first.append("sess-keep", [text_event("kept")], expected_head=0, fence=0)
    await first.close()
    # Reopen twice, once concurrently, as several hosts starting together would.
    again = await asyncio.gather(PostgresStore.open(pg_url), PostgresStore.open(pg_url))
    third = await PostgresStore.open(pg_url)
    try:
        assert await third.schema_version() == postgres.SCHEMA_VERSION
        assert [record_text(r) for r in await third.read("sess-keep")] == ["kept"]
        assert await third.verify("sess-keep") == 1
    finally:
        for s in (*again, third):
            await s.close()
    conn = await asyncpg.connect(pg_url)
    try:
        rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY 1")
        versions = [r["version"] for r in rows]
    finally:
        await conn.close()
    assert versions == [m.version for m in postgres.MIGRATIONS]


async def test_concurrent_first_opens_migrate_once(pg_url: str) -> None:
    stores = await asyncio.gather(*(PostgresStore.open(pg_url) for _ in range(4)))
    for s in stores:
        await s.close()
    conn = await asyncpg.connect(pg_url)
    try:
        count = await conn.fetchval("SELECT count(*) FROM schema_migrations")
    finally:
        await conn.close()
    assert count == len(postgres.MIGRATIONS)


async def test_newer_schema_is_refused(pg_url: str) -> None:
    opened = await PostgresStore.open(pg_url)
    await opened.close()
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, 'from the future')",
            postgres.SCHEMA_VERSION + 1,
        )
    finally:
        await conn.close()
    with pytest.raises(SchemaError, match=r"unsupported database schema.*upgrade agentsessions"):
        await PostgresStore.open(pg_url)


async def test_foreign_database_is_refused_and_left_alone(pg_url: str) -> None:
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, what TEXT)")
        with pytest.raises(SchemaError, match="not an agentsessions journal"):
            await PostgresStore.open(pg_url)
        tables = {
            r["table_name"]
            for r in await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            )
        }
    finally:
        await conn.close()
    assert tables == {"events"}


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("mysql://127.0.0.1/db", "scheme"),
        ("postgresql://127.0.0.1:notaport/db", "port"),
        ("postgresql://127.0.0.1:70000/db", "port"),
        ("postgresql:///db", "no host"),
        ("postgresql://127.0.0.1/a/b", "database name"),
    ],
)
async def test_malformed_url_is_a_clear_error(url: str, why: str) -> None:
    with pytest.raises(PostgresURLError, match=rf"malformed PostgreSQL URL.*{why}"):
        await PostgresStore.open(url)


async def test_url_errors_never_echo_the_password() -> None:
    with pytest.raises(PostgresURLError) as caught:
        await PostgresStore.open("postgresql://user:hunter2@127.0.0.1:notaport/db")
    assert "hunter2" not in str(caught.value)


async def test_unreachable_server_is_a_store_error() -> None:
    # Port 1 on loopback: nothing listens there, the connection is refused at once.
    with pytest.raises(StoreError, match="cannot connect to PostgreSQL") as caught:
        await PostgresStore.open("postgresql://u:secret@127.0.0.1:1/db")
    assert "secret" not in str(caught.value)


async def test_missing_database_is_a_store_error(pg_server: Any) -> None:
    with pytest.raises(StoreError, match="cannot open PostgreSQL journal"):
        await PostgresStore.open(pg_server.database_url("agentsessions_no_such_db"))


async def test_driver_errors_surface_as_store_errors(store: PostgresStore, pg_url: str) -> None:
    await store.create_session(SessionRow(uid="sess-gone", project="p"))
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("DROP TABLE events")
    finally:
        await conn.close()
    with pytest.raises(StoreError) as caught:
        await store.append("sess-gone", [text_event("x")], expected_head=0, fence=0)
    assert "events" in str(caught.value)
    with pytest.raises(StoreError):
        await store.read("sess-gone")


async def test_one_flush_settles_each_append_on_its_own(store: PostgresStore) -> None:
    uids = [f"sess-batch-{i}" for i in range(40)]
    for uid in uids:
        await store.create_session(SessionRow(uid=uid, project="p"))
        await store.append(uid, [text_event("seed")], expected_head=0, fence=0)
    fence_uid = uids[-2]
    await store.new_fence(fence_uid)
    await store.new_fence(fence_uid)
    # Every third append has a stale CAS point and the last one a superseded fence; they
    # are queued together so they share flushes with the good ones.
    calls = [
        store.append(uid, [text_event(f"next {i}")], expected_head=0 if i % 3 == 0 else 1, fence=1)
        for i, uid in enumerate(uids)
    ]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    for i, (uid, outcome) in enumerate(zip(uids, outcomes, strict=True)):
        if i % 3 == 0:
            assert isinstance(outcome, ConflictError), (uid, outcome)
        elif uid == fence_uid:
            assert isinstance(outcome, FencedError), (uid, outcome)
        else:
            assert not isinstance(outcome, BaseException), (uid, outcome)
            assert [r.seq for r in outcome] == [2]
            assert await store.verify(uid) == 2


async def test_same_session_appends_in_one_flush_chain_in_order(store: PostgresStore) -> None:
    await store.create_session(SessionRow(uid="sess-chain", project="p"))
    first = store.append("sess-chain", [text_event("a"), text_event("b")], expected_head=0, fence=0)
    second = store.append("sess-chain", [text_event("c")], expected_head=2, fence=0)
    loser = store.append("sess-chain", [text_event("x")], expected_head=0, fence=0)
    got = await asyncio.gather(first, second, loser, return_exceptions=True)
    assert isinstance(got[2], ConflictError)
    records = await store.read("sess-chain")
    assert [record_text(r) for r in records] == ["a", "b", "c"]
    assert records[2].prev_hash == records[1].content_hash
    assert await store.verify("sess-chain") == 3


async def test_tampered_row_is_named_by_verify(store: PostgresStore, pg_url: str) -> None:
    await store.create_session(SessionRow(uid="sess-tamper", project="p"))
    await store.append("sess-tamper", [text_event(t) for t in "abcd"], expected_head=0, fence=0)
    conn = await asyncpg.connect(pg_url)
    try:
        forged = text_event("forged").SerializeToString()
        await conn.execute("UPDATE events SET event = $1 WHERE session = 'sess-tamper' AND seq = 3", forged)
    finally:
        await conn.close()
    with pytest.raises(TamperedError) as caught:
        await store.verify("sess-tamper")
    assert (caught.value.session, caught.value.seq) == ("sess-tamper", 3)


async def test_truncated_journal_is_caught_by_verify(store: PostgresStore, pg_url: str) -> None:
    await store.create_session(SessionRow(uid="sess-cut", project="p"))
    await store.append("sess-cut", [text_event(t) for t in "abc"], expected_head=0, fence=0)
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("DELETE FROM events WHERE session = 'sess-cut' AND seq = 3")
    finally:
        await conn.close()
    with pytest.raises(TamperedError) as caught:
        await store.verify("sess-cut")
    assert caught.value.seq == 3


async def test_import_records_is_all_or_nothing(store: PostgresStore) -> None:
    await store.create_session(SessionRow(uid="sess-src", project="p"))
    records = await store.append("sess-src", [text_event(t) for t in "xyz"], expected_head=0, fence=0)
    copied = await store.import_records(SessionRow(uid="sess-copy", project="p"), records)
    assert copied.last_seq == 3
    assert [r.content_hash for r in await store.read("sess-copy")] == [r.content_hash for r in records]
    broken = [records[0], records[2]]
    with pytest.raises(TamperedError):
        await store.import_records(SessionRow(uid="sess-broken", project="p"), broken)
    assert await store.get_session("sess-broken") is None
    assert await store.read("sess-broken") == []


# -- forks share their parent's prefix --------------------------------------------------------


def fork_marker(at_seq: int) -> common_pb2.Event:
    return common_pb2.Event(
        kind=common_pb2.EVENT_LIFECYCLE,
        lifecycle=common_pb2.Lifecycle(kind=common_pb2.Lifecycle.LIFECYCLE_FORK, detail=f"parent@{at_seq}"),
    )


async def stored_row_count(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM events"))
    finally:
        await conn.close()


async def test_fork_children_share_the_prefix_instead_of_copying(store: PostgresStore, pg_url: str) -> None:
    await store.create_session(SessionRow(uid="root", project="p"))
    parent = await store.append("root", [text_event(f"r{i}") for i in range(100)], expected_head=0, fence=0)
    children = [SessionRow(uid=f"kid{i}", project="p") for i in range(32)]
    await store.fork("root", 60, children, fork_marker(60))
    # 100 parent rows plus one FORK marker per child: the prefix is not copied.
    assert await stored_row_count(pg_url) == 100 + 32
    for child in ("kid0", "kid31"):
        records = await store.read(child)
        assert records[:60] == parent[:60]
        assert records[60].prev_hash == parent[59].content_hash
        assert await store.verify(child) == 61
        assert [r.seq for r in await store.read(child, 59, 61)] == [59, 60, 61]
    # The parent moves on; its children do not see it.
    await store.append("root", [text_event("later")], expected_head=100, fence=0)
    assert (await store.head("kid0")).seq == 61
    assert len(await store.read("kid0")) == 61


async def test_fork_of_a_fork_resolves_through_every_ancestor(store: PostgresStore) -> None:
    await store.create_session(SessionRow(uid="g", project="p"))
    await store.append("g", [text_event(f"g{i}") for i in range(10)], expected_head=0, fence=0)
    await store.fork("g", 6, [SessionRow(uid="p1", project="p")], fork_marker(6))
    await store.append("p1", [text_event(f"p{i}") for i in range(5)], expected_head=7, fence=0)
    # Past the parent's own base: shares from p1, which shares from g.
    await store.fork("p1", 10, [SessionRow(uid="c1", project="p")], fork_marker(10))
    # Within the parent's base: taken straight from g.
    await store.fork("p1", 4, [SessionRow(uid="c2", project="p")], fork_marker(4))
    c1 = await store.read("c1")
    assert [record_text(r) for r in c1[:10]] == [*(f"g{i}" for i in range(6)), "", "p0", "p1", "p2"]
    assert c1[:10] == (await store.read("p1"))[:10]
    assert await store.verify("c1") == 11
    c2 = await store.read("c2")
    assert c2[:4] == (await store.read("g"))[:4]
    assert await store.verify("c2") == 5


async def test_purging_a_parent_keeps_its_children_whole(store: PostgresStore) -> None:
    await store.create_session(SessionRow(uid="g", project="p"))
    await store.append("g", [text_event(f"g{i}") for i in range(8)], expected_head=0, fence=0)
    await store.fork("g", 5, [SessionRow(uid="mid", project="p")], fork_marker(5))
    await store.append("mid", [text_event(f"m{i}") for i in range(4)], expected_head=6, fence=0)
    await store.fork("mid", 9, [SessionRow(uid="leaf", project="p")], fork_marker(9))
    await store.fork("mid", 3, [SessionRow(uid="early", project="p")], fork_marker(3))
    before = {uid: await store.read(uid) for uid in ("mid", "leaf", "early")}

    await store.delete_session("mid", purge=True)
    assert await store.read("mid") == []
    assert (await store.head("mid")).seq == 0
    for uid in ("leaf", "early"):
        assert await store.read(uid) == before[uid]
        assert await store.verify(uid) == len(before[uid])

    await store.delete_session("g", purge=True)
    assert await store.read("g") == []
    for uid in ("leaf", "early"):
        assert await store.read(uid) == before[uid]
        assert await store.verify(uid) == len(before[uid])


async def test_tampering_a_shared_prefix_is_caught_in_every_child(store: PostgresStore, pg_url: str) -> None:
    await store.create_session(SessionRow(uid="root", project="p"))
    await store.append("root", [text_event(f"r{i}") for i in range(6)], expected_head=0, fence=0)
    await store.fork(
        "root", 4, [SessionRow(uid="a", project="p"), SessionRow(uid="b", project="p")], fork_marker(4)
    )
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("UPDATE events SET hash = repeat('f', 64) WHERE session = 'root' AND seq = 2")
    finally:
        await conn.close()
    for uid in ("root", "a", "b"):
        with pytest.raises(TamperedError) as caught:
            await store.verify(uid)
        assert caught.value.seq == 2


# -- schema upgrades -------------------------------------------------------------------------


async def execute_all(url: str, *statements: str) -> None:
    """Run ``statements`` in order on a connection of their own."""
    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


async def downgrade_to_version_2(url: str) -> None:
    """Turn a fresh journal into what migrations 1 and 2 created."""
    await execute_all(
        url,
        "DROP TABLE journal_probe",
        "ALTER TABLE sessions DROP COLUMN exec_projection",
        "DELETE FROM schema_migrations WHERE version > 2",
    )


async def downgrade_to_version_1(url: str) -> None:
    """Turn a fresh journal into what migration 1 alone created."""
    await downgrade_to_version_2(url)
    await execute_all(
        url,
        "DROP INDEX sessions_base",
        "ALTER TABLE sessions DROP COLUMN base_uid, DROP COLUMN base_seq",
        "DELETE FROM schema_migrations WHERE version > 1",
    )


async def test_a_version_1_journal_is_upgraded_in_place(pg_url: str) -> None:
    first = await PostgresStore.open(pg_url)
    await first.close()
    await downgrade_to_version_1(pg_url)
    conn = await asyncpg.connect(pg_url)
    try:
        # A version-1 writer copied fork prefixes; such rows must read back unchanged.
        await conn.execute(
            "INSERT INTO sessions (uid, project, created_at, updated_at) VALUES ('old', 'p', 1, 1)"
        )
    finally:
        await conn.close()
    with pytest.raises(SchemaError, match="version 2 is missing"):
        await PostgresStore.open(pg_url, migrate=False)
    upgraded = await PostgresStore.open(pg_url)
    try:
        assert await upgraded.schema_version() == postgres.SCHEMA_VERSION
        await upgraded.append("old", [text_event("after upgrade")], expected_head=0, fence=0)
        await upgraded.fork("old", 1, [SessionRow(uid="new", project="p")], fork_marker(1))
        assert await upgraded.verify("new") == 2
    finally:
        await upgraded.close()


async def test_close_commits_every_append_already_queued(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url, flushers=1, max_batch=4)
    uids = [f"sess-q{i}" for i in range(24)]
    for uid in uids:
        await store.create_session(SessionRow(uid=uid, project="p"))
    pending = [
        asyncio.ensure_future(store.append(uid, [text_event(uid)], expected_head=0, fence=0)) for uid in uids
    ]
    await asyncio.sleep(0)  # every append is queued; one small flush is in flight
    await store.close()
    assert [len(await p) for p in pending] == [1] * len(uids)
    with pytest.raises(StoreError, match="closed"):
        await store.append(uids[0], [text_event("late")], expected_head=1, fence=0)
    reopened = await PostgresStore.open(pg_url)
    try:
        for uid in uids:
            assert await reopened.verify(uid) == 1
    finally:
        await reopened.close()


async def test_a_version_2_journal_gets_each_sessions_execution_state(pg_url: str) -> None:
    """Migration 3 folds every existing session's journal into its row once."""
    store = await PostgresStore.open(pg_url)
    try:
        await store.create_session(SessionRow(uid="parked", project="p"))
        await store.append("parked", parked_turn(), expected_head=0, fence=0)
        await store.fork("parked", 2, [SessionRow(uid="kid", project="p")], fork_marker(2))
        await store.create_session(SessionRow(uid="empty", project="p"))
        before = {uid: await store.get_session(uid) for uid in ("parked", "kid", "empty")}
    finally:
        await store.close()
    await downgrade_to_version_2(pg_url)
    with pytest.raises(SchemaError, match="version 3 is missing"):
        await PostgresStore.open(pg_url, migrate=False)
    upgraded = await PostgresStore.open(pg_url)
    try:
        assert await upgraded.schema_version() == postgres.SCHEMA_VERSION == 3
        for uid, row in before.items():
            got = await upgraded.get_session(uid)
            assert got is not None and row is not None
            folded = execstate.fold([r.event for r in await upgraded.read(uid)], fork_seq=got.fork_seq)
            assert got.exec_projection == folded == row.exec_projection, uid
        rows, _ = await upgraded.list_sessions("p", 10, "")
        gated = [
            r.uid
            for r in rows
            if r.exec_projection and r.exec_projection.latest and r.exec_projection.latest.gate()
        ]
        assert gated == ["parked"]
    finally:
        await upgraded.close()
