"""``agentsessions journal verify|export|import``, run as the installed console script."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import sqlite3
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from agentsessions.host.journal import canon, gojson
from agentsessions.host.journal.postgres import PostgresStore
from agentsessions.host.journal.sqlite import SqliteStore
from agentsessions.host.journal.store import SessionRow
from agentsessions.v1 import common_pb2
from tests.fixtures import GO_JOURNALS
from tests.journal.pg import pg_server, pg_url
from tests.support.host import text_output

__all__ = ["pg_server", "pg_url"]

CONSOLE_SCRIPT = Path(sys.executable).parent / "agentsessions"
FIXTURES = GO_JOURNALS
RUN_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str


async def journal(*args: str | Path) -> Run:
    """Run ``agentsessions journal ARGS`` and collect its exit status and output."""
    assert CONSOLE_SCRIPT.exists(), f"console script missing: {CONSOLE_SCRIPT} (run make setup)"
    proc = await asyncio.create_subprocess_exec(
        str(CONSOLE_SCRIPT),
        "journal",
        *(str(a) for a in args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(), err.decode())


def fixture_files() -> list[Path]:
    files = sorted(FIXTURES.glob("*.json"))
    assert files, f"no fixtures under {FIXTURES}"
    return files


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def seed(store: SqliteStore | PostgresStore) -> None:
    """Two sessions of five records and a fork child of the first."""
    for uid in ("sess-a", "sess-b"):
        await store.create_session(SessionRow(uid=uid, project="p", harness="echo"))
        fence = await store.new_fence(uid)
        await store.append(uid, [text_output(f"{uid} {i}") for i in range(5)], expected_head=0, fence=fence)
    marker = common_pb2.Event(
        kind=common_pb2.EVENT_LIFECYCLE,
        lifecycle=common_pb2.Lifecycle(kind=common_pb2.Lifecycle.LIFECYCLE_FORK, detail="parent@3"),
    )
    await store.fork("sess-a", 3, [SessionRow(uid="sess-a-child", project="p", harness="echo")], marker)


async def seeded_sqlite(path: Path) -> None:
    store = await SqliteStore.open(path)
    try:
        await seed(store)
    finally:
        await store.close()


def sql(path: Path, statement: str, params: Sequence[object] = ()) -> int:
    """Run one statement on a SQLite file and close it (so nothing stays in its WAL)."""
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        return db.execute(statement, params).rowcount


def tamper_sqlite(path: Path, uid: str, seq: int) -> None:
    forged = text_output("forged").SerializeToString()
    changed = sql(path, "UPDATE events SET event = ? WHERE session = ? AND seq = ?", (forged, uid, seq))
    assert changed == 1


async def stored_records(path: Path, uid: str) -> list[common_pb2.LogRecord]:
    store = await SqliteStore.open(path)
    try:
        return await store.read(uid)
    finally:
        await store.close()


# -- verify -------------------------------------------------------------------------------


async def test_verify_accepts_an_intact_journal(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    await seeded_sqlite(db)
    run = await journal("verify", "--journal", db)
    assert run.code == 0, run.err
    # 5 + 5 + (3 copied + FORK marker)
    assert "3 sessions, 14 records verified" in run.out


async def test_verify_names_the_tampered_session_and_seq(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    await seeded_sqlite(db)
    tamper_sqlite(db, "sess-b", 3)
    run = await journal("verify", "--journal", db)
    assert run.code == 1
    assert "session sess-b seq 3" in run.err
    assert "sess-a " not in run.err
    only_good = await journal("verify", "--journal", f"sqlite://{db}", "--session", "sess-a")
    assert only_good.code == 0, only_good.err
    assert "1 sessions, 5 records verified" in only_good.out


async def test_verify_unknown_session_is_bad_input(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    await seeded_sqlite(db)
    run = await journal("verify", "--journal", db, "--session", "sess-nope")
    assert run.code == 2
    assert "no session sess-nope" in run.err


# -- export -------------------------------------------------------------------------------


async def test_export_materializes_every_session_and_verifies(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    out = tmp_path / "export.db"
    await seeded_sqlite(db)
    run = await journal("export", "--journal", db, "--out", out)
    assert run.code == 0, run.err
    assert "exported 3 sessions, 14 records" in run.out
    checked = await journal("verify", "--journal", out)
    assert checked.code == 0, checked.err
    assert "3 sessions, 14 records verified" in checked.out
    for uid in ("sess-a", "sess-b", "sess-a-child"):
        assert await stored_records(out, uid) == await stored_records(db, uid)
    # Standalone: one file, readable with plain sqlite3 in the reference layout (spec 3.5).
    assert names(tmp_path) == ["export.db", "journal.db"]
    with contextlib.closing(sqlite3.connect(f"file:{out}?mode=ro", uri=True)) as ro:
        rows = ro.execute(
            "SELECT seq, prev_hash, hash, event FROM events WHERE session = ? ORDER BY seq", ("sess-a-child",)
        ).fetchall()
    assert [r[0] for r in rows] == [1, 2, 3, 4]
    assert common_pb2.Event.FromString(rows[3][3]).lifecycle.detail == "parent@3"
    # What the reference's verifier does (spec 3.5): each session's rows alone, from prev "".
    with contextlib.closing(sqlite3.connect(f"file:{out}?mode=ro", uri=True)) as ro:
        for (uid,) in ro.execute("SELECT session FROM sessions ORDER BY session").fetchall():
            prev, seqs = "", []
            query = "SELECT seq, prev_hash, hash, event FROM events WHERE session = ? ORDER BY seq"
            for seq, prev_hash, digest, blob in ro.execute(query, (uid,)):
                assert prev_hash == prev
                assert canon.content_hash(common_pb2.Event.FromString(blob), prev, seq) == digest
                prev = digest
                seqs.append(seq)
            assert seqs == list(range(1, len(seqs) + 1)) and seqs, uid


async def test_export_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    out = tmp_path / "export.db"
    await seeded_sqlite(db)
    out.write_bytes(b"precious")
    run = await journal("export", "--journal", db, "--out", out)
    assert run.code == 2
    assert "refusing to overwrite" in run.err
    assert out.read_bytes() == b"precious"
    forced = await journal("export", "--journal", db, "--out", out, "--force")
    assert forced.code == 0, forced.err
    assert (await journal("verify", "--journal", out)).code == 0


async def test_export_of_a_tampered_journal_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    out = tmp_path / "export.db"
    await seeded_sqlite(db)
    tamper_sqlite(db, "sess-a", 2)
    run = await journal("export", "--journal", db, "--out", out)
    assert run.code == 1
    assert "session sess-a seq 2" in run.err
    assert names(tmp_path) == ["journal.db"]


# -- import -------------------------------------------------------------------------------


async def test_import_every_fixture_then_verify(tmp_path: Path) -> None:
    db = tmp_path / "imported.db"
    expected_total = 0
    for fixture in fixture_files():
        uid = "sess-" + fixture.stem
        run = await journal("import", "--journal", db, fixture, "--session", uid)
        assert run.code == 0, run.err
        assert f"into session {uid}" in run.out
        dumped = gojson.load_records(fixture)
        expected_total += len(dumped)
        stored = await stored_records(db, uid)
        # Verbatim: stored hashes and fences, not recomputed ones.
        assert [(r.seq, r.prev_hash, r.content_hash, r.fence) for r in stored] == [
            (d.seq, d.prev_hash, d.hash, d.fence) for d in dumped
        ]
    run = await journal("verify", "--journal", db)
    assert run.code == 0, run.err
    assert f"{len(fixture_files())} sessions, {expected_total} records verified" in run.out


async def test_import_refuses_a_tampered_dump_and_writes_nothing(tmp_path: Path) -> None:
    dump = json.loads((FIXTURES / "multi-turn.json").read_text())
    dump[4]["Event"]["Message"]["Parts"][0]["Text"]["Text"] = "forged"
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(dump))
    db = tmp_path / "journal.db"
    run = await journal("import", "--journal", db, forged, "--session", "sess-forged")
    assert run.code == 1
    assert f"seq {dump[4]['Seq']}" in run.err
    assert "nothing imported" in run.err
    assert not db.exists()


async def test_import_into_an_existing_session_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    await seeded_sqlite(db)
    before = await stored_records(db, "sess-a")
    run = await journal("import", "--journal", db, FIXTURES / "completed.json", "--session", "sess-a")
    assert run.code == 2
    assert "already exists" in run.err
    assert await stored_records(db, "sess-a") == before


# -- bad input ----------------------------------------------------------------------------


async def test_missing_or_unreadable_inputs_are_clear_errors(tmp_path: Path) -> None:
    missing = await journal("verify", "--journal", tmp_path / "nope.db")
    assert missing.code == 2
    assert "no such file" in missing.err
    assert not (tmp_path / "nope.db").exists()

    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database at all" * 100)
    run = await journal("verify", "--journal", garbage)
    assert run.code == 2
    assert "not a readable SQLite database" in run.err

    directory = await journal("verify", "--journal", tmp_path)
    assert directory.code == 2
    assert "not a regular file" in directory.err

    no_fixture = await journal("import", "--journal", tmp_path / "j.db", tmp_path / "absent.json")
    assert no_fixture.code == 2
    assert "no such file" in no_fixture.err

    not_json = tmp_path / "bad.json"
    not_json.write_text("{ not json")
    bad = await journal("import", "--journal", tmp_path / "j.db", not_json)
    assert bad.code == 2
    assert "not a Go journal dump" in bad.err

    wrong_shape = tmp_path / "shape.json"
    wrong_shape.write_text(json.dumps([{"Seq": "one"}]))
    shaped = await journal("import", "--journal", tmp_path / "j.db", wrong_shape)
    assert shaped.code == 2
    assert "not a Go journal dump" in shaped.err
    assert not (tmp_path / "j.db").exists()


async def test_foreign_and_newer_databases_are_refused_untouched(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign.db"
    sql(foreign, "CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    newer = tmp_path / "newer.db"
    await seeded_sqlite(newer)
    sql(newer, "PRAGMA user_version = 99")
    for path, why in ((foreign, "not an agentsessions journal"), (newer, "unsupported database schema")):
        before = file_digest(path)
        for args in (
            ("verify", "--journal", path),
            ("export", "--journal", path, "--out", tmp_path / "out.db"),
            ("import", "--journal", path, FIXTURES / "completed.json"),
        ):
            run = await journal(*args)
            assert run.code == 2, (args, run)
            assert why in run.err, (args, run.err)
        assert file_digest(path) == before
    assert not (tmp_path / "out.db").exists()


@pytest.mark.parametrize(
    "url",
    ["postgresql://127.0.0.1:notaport/db", "postgres://127.0.0.1:99999/db", "postgresql:///nohost"],
)
async def test_malformed_postgres_url_is_a_clear_error(url: str) -> None:
    for args in (("verify", "--journal", url), ("import", "--journal", url, FIXTURES / "completed.json")):
        run = await journal(*args)
        assert run.code == 2
        assert "malformed PostgreSQL URL" in run.err
        assert "Traceback" not in run.err


async def test_journal_without_subcommand_is_a_usage_error() -> None:
    run = await journal()
    assert run.code == 2
    assert "verify" in run.err


# -- PostgreSQL ---------------------------------------------------------------------------


async def seeded_postgres(url: str) -> None:
    store = await PostgresStore.open(url)
    try:
        await seed(store)
    finally:
        await store.close()


@pytest.mark.postgres
async def test_postgres_verify_export_and_tamper(pg_url: str, tmp_path: Path) -> None:
    await seeded_postgres(pg_url)
    run = await journal("verify", "--journal", pg_url)
    assert run.code == 0, run.err
    assert "3 sessions, 14 records verified" in run.out

    out = tmp_path / "from-postgres.db"
    exported = await journal("export", "--journal", pg_url, "--out", out)
    assert exported.code == 0, exported.err
    assert (await journal("verify", "--journal", out)).code == 0
    assert [r.content_hash for r in await stored_records(out, "sess-a-child")] == [
        r.content_hash for r in await _pg_read(pg_url, "sess-a-child")
    ]

    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("UPDATE events SET hash = repeat('0', 64) WHERE session = 'sess-b' AND seq = 4")
    finally:
        await conn.close()
    tampered = await journal("verify", "--journal", pg_url)
    assert tampered.code == 1
    assert "session sess-b seq 4" in tampered.err


@pytest.mark.postgres
async def test_postgres_import_every_fixture_then_verify(pg_url: str) -> None:
    for fixture in fixture_files():
        run = await journal("import", "--journal", pg_url, fixture, "--session", "sess-" + fixture.stem)
        assert run.code == 0, run.err
    run = await journal("verify", "--journal", pg_url)
    assert run.code == 0, run.err
    assert f"{len(fixture_files())} sessions" in run.out


@pytest.mark.postgres
async def test_postgres_verify_of_an_empty_database_creates_nothing(pg_url: str) -> None:
    run = await journal("verify", "--journal", pg_url)
    assert run.code == 2
    assert "holds no agentsessions journal" in run.err
    conn = await asyncpg.connect(pg_url)
    try:
        tables = await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        )
    finally:
        await conn.close()
    assert tables == []


async def _pg_read(url: str, uid: str) -> Sequence[common_pb2.LogRecord]:
    store = await PostgresStore.open(url)
    try:
        return await store.read(uid)
    finally:
        await store.close()


# -- journals written by the Go reference host ------------------------------------------------

REFERENCE_SCHEMA = (
    "CREATE TABLE sessions (session TEXT PRIMARY KEY, fence INTEGER NOT NULL DEFAULT 0, "
    "project TEXT NOT NULL DEFAULT '', name TEXT NOT NULL DEFAULT '', harness TEXT NOT NULL DEFAULT '', "
    "model TEXT NOT NULL DEFAULT '', parent_uid TEXT NOT NULL DEFAULT '', "
    "fork_seq INTEGER NOT NULL DEFAULT 0, "
    "compute_state TEXT NOT NULL DEFAULT 'NONE', created_at INTEGER NOT NULL DEFAULT 0, "
    "updated_at INTEGER NOT NULL DEFAULT 0, labels TEXT, annotations TEXT, origin TEXT, identity TEXT)",
    "CREATE TABLE events (session TEXT NOT NULL, seq INTEGER NOT NULL, prev_hash TEXT NOT NULL, "
    "hash TEXT NOT NULL, fence INTEGER NOT NULL, event BLOB NOT NULL, PRIMARY KEY (session, seq))",
    "CREATE INDEX sessions_project_created ON sessions(project, created_at DESC, session)",
    "PRAGMA user_version = 2",
)


def reference_journal(path: Path) -> dict[str, list[gojson.GoRecord]]:
    """A SQLite file in the Go host's layout (spec 3.5) holding two fixture journals."""
    sessions = {
        "sess-go-done": gojson.load_records(FIXTURES / "completed.json"),
        "sess-go-mixed": gojson.load_records(FIXTURES / "mixed-completed.json"),
    }
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        for statement in REFERENCE_SCHEMA:
            db.execute(statement)
        for i, (uid, records) in enumerate(sessions.items()):
            db.execute(
                "INSERT INTO sessions (session, fence, project, harness, created_at, updated_at, "
                "labels, identity) VALUES (?, 3, 'default', 'echo', ?, ?, ?, ?)",
                (uid, 1000 + i, 1000 + i, json.dumps({"team": "go"}), json.dumps({"Principal": "alice"})),
            )
            db.executemany(
                "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?)",
                [(uid, r.seq, r.prev_hash, r.hash, r.fence, r.event.SerializeToString()) for r in records],
            )
    return sessions


async def test_a_go_reference_journal_verifies_and_exports_read_only(tmp_path: Path) -> None:
    go_db = tmp_path / "go.db"
    sessions = reference_journal(go_db)
    before = file_digest(go_db)
    total = sum(len(r) for r in sessions.values())
    run = await journal("verify", "--journal", go_db)
    assert run.code == 0, run.err
    assert f"2 sessions, {total} records verified" in run.out

    out = tmp_path / "ours.db"
    exported = await journal("export", "--journal", go_db, "--out", out)
    assert exported.code == 0, exported.err
    assert file_digest(go_db) == before
    checked = await journal("verify", "--journal", out)
    assert checked.code == 0, checked.err
    store = await SqliteStore.open(out)
    try:
        row = await store.get_session("sess-go-mixed")
        assert row is not None
        assert (row.project, row.harness, dict(row.labels)) == ("default", "echo", {"team": "go"})
        assert row.identity is not None and row.identity.principal == "alice"
        stored = await store.read("sess-go-mixed")
    finally:
        await store.close()
    assert [(r.seq, r.content_hash, r.fence) for r in stored] == [
        (g.seq, g.hash, g.fence) for g in sessions["sess-go-mixed"]
    ]


async def test_a_tampered_go_reference_journal_is_named(tmp_path: Path) -> None:
    go_db = tmp_path / "go.db"
    reference_journal(go_db)
    sql(go_db, "UPDATE events SET hash = ? WHERE session = 'sess-go-mixed' AND seq = 5", ("0" * 64,))
    run = await journal("verify", "--journal", go_db)
    assert run.code == 1
    assert "session sess-go-mixed seq 5" in run.err
    assert "sess-go-done" not in run.err
