"""``agentsessions journal``: verify, export and import journals.

A journal is named by ``--journal``: a SQLite file (``path`` or ``sqlite:///path``) or a
``postgres://`` / ``postgresql://`` URL.

* ``verify`` recomputes every session's hash chain (spec 3.2) from the stored records;
* ``export`` writes every live session, fully materialized, into a new standalone SQLite file
  (the ``events`` table in the reference layout, spec 3.5);
* ``import`` loads a journal the Go reference host dumped as JSON into a new session, records
  verbatim (stored hashes and fences), after checking every hash.

``verify`` and ``export`` also read a SQLite journal the Go reference host wrote (its own
layout, spec 3.5), read-only: exporting one is how its sessions move to this host.

Exit status: 0 success, 1 a chain does not verify, 2 bad input (nothing was written).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sqlite3
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Final, Protocol

import aiosqlite
from google.protobuf import json_format
from google.protobuf.message import Message

from agentsessions.host.journal import gojson, redact_url
from agentsessions.host.journal.canon import content_hash
from agentsessions.host.journal.sqlite import APPLICATION_ID, SqliteStore
from agentsessions.host.journal.store import (
    JournalStore,
    SchemaError,
    SessionRow,
    StoreError,
    TamperedError,
)
from agentsessions.host.progress import progress
from agentsessions.v1 import common_pb2, harness_registry_pb2

__all__ = ["EXIT_BAD_INPUT", "EXIT_OK", "EXIT_TAMPERED", "add_parser"]

EXIT_OK: Final = 0
EXIT_TAMPERED: Final = 1
EXIT_BAD_INPUT: Final = 2

_POSTGRES_SCHEMES: Final = ("postgres://", "postgresql://")
_SQLITE_SCHEME: Final = "sqlite://"
# The Go daemon's defaults for sessions it created: an imported v0.1.2 journal ran there.
_DEFAULT_PROJECT: Final = "default"
_DEFAULT_HARNESS: Final = "echo"


class InputError(Exception):
    """Bad input the command refuses before writing anything (exit 2)."""


class _Importer(Protocol):
    async def import_records(
        self, row: SessionRow, records: Sequence[common_pb2.LogRecord]
    ) -> SessionRow: ...


class _VerbatimStore(JournalStore, _Importer, Protocol):
    """A JournalStore that can also take records verbatim (every backend here can)."""


class _Source(Protocol):
    """What verify and export read from a journal."""

    async def session_uids(self) -> list[str]: ...
    async def get_session(self, uid: str) -> SessionRow | None: ...
    async def verify(self, uid: str) -> int: ...
    async def read(self, uid: str, from_seq: int = 1, to_seq: int = 0) -> list[common_pb2.LogRecord]: ...
    async def list_harnesses(self) -> list[harness_registry_pb2.HarnessRegistration]: ...
    async def close(self) -> None: ...


def add_parser(subparsers: Any) -> None:
    """Register ``journal`` and its subcommands on the ``agentsessions`` parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "journal",
        help="verify, export and import journals",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="journal_command", required=True, metavar="{verify,export,import}")
    target_help = "SQLite journal file (path or sqlite:///path) or postgres:// URL"

    verify = sub.add_parser("verify", help="recompute every hash chain of a journal")
    verify.add_argument("--journal", required=True, help=target_help)
    verify.add_argument("--session", default="", help="verify only this session uid")
    verify.set_defaults(func=_runner(_verify))

    export = sub.add_parser("export", help="write every session into a new standalone SQLite file")
    export.add_argument("--journal", required=True, help=target_help)
    export.add_argument("--out", required=True, help="the SQLite file to create (FILE.db)")
    export.add_argument("--force", action="store_true", help="replace --out if it exists")
    export.set_defaults(func=_runner(_export))

    imp = sub.add_parser("import", help="import a Go reference journal dump (JSON) as a new session")
    imp.add_argument("--journal", required=True, help=target_help + "; a missing SQLite file is created")
    imp.add_argument("fixture", metavar="FIXTURE.json", help="JSON array of Go eventlog records")
    imp.add_argument("--session", default="", help="uid of the new session (default: a fresh sess-...)")
    imp.add_argument("--project", default=_DEFAULT_PROJECT, help="project of the new session")
    imp.add_argument("--harness", default=_DEFAULT_HARNESS, help="harness of the new session")
    imp.add_argument("--name", default="", help="display name of the new session")
    imp.set_defaults(func=_runner(_import))


def _runner(
    command: Callable[[argparse.Namespace], Coroutine[Any, Any, int]],
) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return asyncio.run(command(args))
        except InputError as exc:
            _error(args, str(exc))
        except StoreError as exc:
            _error(args, str(exc))
        except KeyboardInterrupt:
            _error(args, "interrupted")
        return EXIT_BAD_INPUT

    return run


def _error(args: argparse.Namespace, message: str) -> None:
    print(f"agentsessions journal {args.journal_command}: error: {message}", file=sys.stderr)


def _shown(target: str) -> str:
    return redact_url(target) if target.startswith(_POSTGRES_SCHEMES) else target


def _sqlite_path(target: str) -> Path:
    path = target[len(_SQLITE_SCHEME) :] if target.startswith(_SQLITE_SCHEME) else target
    if not path:
        raise InputError(f"journal {target!r} names no SQLite file")
    return Path(path)


def _check_existing_file(path: Path, what: str) -> None:
    """Refuse a path that is not an existing, readable, non-empty file (before opening it)."""
    if not path.exists():
        raise InputError(f"{what} {path}: no such file")
    if not path.is_file():
        raise InputError(f"{what} {path}: not a regular file")
    if not os.access(path, os.R_OK):
        raise InputError(f"{what} {path}: not readable (permission denied)")
    if path.stat().st_size == 0:
        raise InputError(f"{what} {path}: empty file, not an agentsessions journal")


async def _open(target: str, *, create: bool) -> _VerbatimStore:
    """Open ``--journal``. Without ``create`` nothing may be created or upgraded."""
    if target.startswith(_POSTGRES_SCHEMES):
        # asyncpg loads only for a PostgreSQL journal (every `agentsessions` command imports this module).
        from agentsessions.host.journal.postgres import PostgresStore

        return await PostgresStore.open(target, pool_size=4, migrate=create)
    if target == "memory:":
        raise InputError("memory: journals vanish with the process; name a SQLite file or a postgres:// URL")
    path = _sqlite_path(target)
    if create:
        if path.exists():
            _check_existing_file(path, "journal")
            if not os.access(path, os.W_OK):
                raise InputError(f"journal {path}: not writable (permission denied)")
        elif not path.parent.is_dir():
            raise InputError(f"journal {path}: directory {path.parent} does not exist")
    else:
        _check_existing_file(path, "journal")
    return await SqliteStore.open(path)


async def _open_source(target: str) -> _Source:
    """Open ``--journal`` for reading: any store, or a Go reference SQLite journal."""
    if not target.startswith(_POSTGRES_SCHEMES) and target != "memory:":
        path = _sqlite_path(target)
        _check_existing_file(path, "journal")
        if await asyncio.to_thread(_is_reference_layout, path):
            return await ReferenceJournal.open(path)
    return await _open(target, create=False)


def _is_reference_layout(path: Path) -> bool:
    """A SQLite file laid out by the Go reference host: no application id of ours, schema
    version 1 or 2, and its ``sessions`` and ``events`` tables."""
    try:
        db = sqlite3.connect(_read_only_uri(path), uri=True)
    except sqlite3.Error:
        return False
    try:
        app_id = db.execute("PRAGMA application_id").fetchone()[0]
        version = db.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error:
        return False  # not a database: the store gives the precise error
    finally:
        db.close()
    return app_id != APPLICATION_ID and version in (1, 2) and {"sessions", "events"} <= tables


def check_chain(where: str, records: Sequence[common_pb2.LogRecord]) -> int:
    """Recompute every link and hash of ``records`` (spec 3.2) from genesis; returns the count.

    Raises TamperedError naming ``where`` and the first bad seq."""
    prev = ""
    for expected, rec in enumerate(records, start=1):
        if rec.seq != expected:
            raise TamperedError(where, expected, f"seq {expected} is missing (found seq {rec.seq})")
        if rec.prev_hash != prev:
            raise TamperedError(where, rec.seq, "prev_hash does not link to the previous record")
        if content_hash(rec.event, prev, rec.seq) != rec.content_hash:
            raise TamperedError(where, rec.seq, "content_hash does not match the recomputed hash")
        prev = rec.content_hash
    return len(records)


_REFERENCE_SESSION_COLUMNS: Final = (
    "project",
    "name",
    "harness",
    "model",
    "parent_uid",
    "fork_seq",
    "created_at",
    "updated_at",
    "labels",
    "annotations",
    "origin",
    "identity",
)


def _read_only_uri(path: Path) -> str:
    return f"{path.resolve().as_uri()}?mode=ro"


class ReferenceJournal:
    """A SQLite journal in the Go reference host's layout, opened read-only."""

    def __init__(self, path: Path, db: aiosqlite.Connection, columns: set[str]) -> None:
        self.path = path
        self._db = db
        self._columns = columns

    @classmethod
    async def open(cls, path: Path) -> ReferenceJournal:
        try:
            db = await aiosqlite.connect(_read_only_uri(path), uri=True)
        except sqlite3.Error as exc:
            raise SchemaError(f"cannot open SQLite journal {path}: {exc}") from None
        try:
            columns = {str(r[1]) for r in await db.execute_fetchall("PRAGMA table_info(sessions)")}
        except sqlite3.Error as exc:
            await db.close()
            raise SchemaError(f"cannot read SQLite journal {path}: {exc}") from None
        return cls(path, db, columns)

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        try:
            return list(await self._db.execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            raise StoreError(f"reading {self.path} failed: {exc}") from exc

    async def session_uids(self) -> list[str]:
        rows = await self._fetch("SELECT session FROM sessions UNION SELECT session FROM events ORDER BY 1")
        return [str(r[0]) for r in rows]

    async def get_session(self, uid: str) -> SessionRow | None:
        wanted = [c for c in _REFERENCE_SESSION_COLUMNS if c in self._columns]
        select = ", ".join(wanted) if wanted else "session"
        rows = await self._fetch(f"SELECT {select} FROM sessions WHERE session = ?", (uid,))
        if not rows:
            return None
        got: dict[str, Any] = dict(zip(wanted, rows[0], strict=False))
        return SessionRow(
            uid=uid,
            project=str(got.get("project") or ""),
            name=str(got.get("name") or ""),
            harness=str(got.get("harness") or ""),
            model=str(got.get("model") or ""),
            labels=_string_map(got.get("labels"), f"{uid} labels"),
            annotations=_string_map(got.get("annotations"), f"{uid} annotations"),
            origin=_message_or_none(common_pb2.Origin(), got.get("origin"), f"{uid} origin"),
            identity=_message_or_none(common_pb2.IdentityRef(), got.get("identity"), f"{uid} identity"),
            parent_uid=str(got.get("parent_uid") or ""),
            fork_seq=int(got.get("fork_seq") or 0),
            create_time_ns=int(got.get("created_at") or 0),
            update_time_ns=int(got.get("updated_at") or 0),
        )

    async def read(self, uid: str, from_seq: int = 1, to_seq: int = 0) -> list[common_pb2.LogRecord]:
        rows = await self._fetch(
            "SELECT seq, prev_hash, hash, fence, event FROM events "
            "WHERE session = ? AND seq >= ? AND (? = 0 OR seq <= ?) ORDER BY seq",
            (uid, max(1, from_seq), to_seq, to_seq),
        )
        records = []
        for seq, prev_hash, digest, fence, blob in rows:
            rec = common_pb2.LogRecord(seq=seq, prev_hash=prev_hash, content_hash=digest, fence=fence)
            try:
                rec.event.ParseFromString(blob)
            except Exception:
                raise TamperedError(uid, int(seq), "stored event does not decode") from None
            records.append(rec)
        return records

    async def verify(self, uid: str) -> int:
        return check_chain(uid, await self.read(uid))

    async def list_harnesses(self) -> list[harness_registry_pb2.HarnessRegistration]:
        # The reference keeps its registry in its own shape; registrations are re-made with
        # RegisterHarness, not copied.
        return []

    async def close(self) -> None:
        await self._db.close()


def _string_map(value: Any, what: str) -> dict[str, str]:
    if value in (None, "", b""):
        return {}
    try:
        loaded = json.loads(value)
    except (TypeError, ValueError):
        raise SchemaError(f"{what}: not a JSON object") from None
    if not isinstance(loaded, dict):
        if loaded is None:
            return {}
        raise SchemaError(f"{what}: not a JSON object")
    return {str(k): str(v) for k, v in loaded.items()}


def _message_or_none(message: Message, value: Any, what: str) -> Any:
    """A JSON column as ``message`` (proto JSON, Go field names accepted); None when absent."""
    if value in (None, "", b""):
        return None
    try:
        loaded = json.loads(value)
    except (TypeError, ValueError):
        raise SchemaError(f"{what}: not a JSON object") from None
    if loaded is None:
        return None
    if not isinstance(loaded, dict):
        raise SchemaError(f"{what}: not a JSON object")
    fields = {f.name for f in message.DESCRIPTOR.fields}
    # Go's encoding/json spells fields like "Principal"; proto JSON like "principal".
    lowered = {k.lower(): v for k, v in loaded.items() if k.lower() in fields and v not in (None, "", {})}
    try:
        json_format.ParseDict(lowered, message)
    except json_format.ParseError as exc:
        raise SchemaError(f"{what}: {exc}") from None
    return message


# -- verify -----------------------------------------------------------------------------------


async def _verify(args: argparse.Namespace) -> int:
    store = await _open_source(args.journal)
    try:
        uids = await store.session_uids()
        if args.session:
            if args.session not in uids:
                raise InputError(f"no session {args.session} in {_shown(args.journal)}")
            uids = [args.session]
        total = 0
        failures: list[TamperedError] = []
        with progress("verifying", total=len(uids), unit="sessions") as bar:
            for uid in uids:
                try:
                    total += await store.verify(uid)
                except TamperedError as exc:
                    failures.append(exc)
                bar.advance()
    finally:
        await store.close()
    for failure in failures:
        print(f"FAILED: session {failure.session} seq {failure.seq}: {failure.why}", file=sys.stderr)
    if failures:
        print(
            f"{len(failures)} of {len(uids)} sessions fail verification in {_shown(args.journal)}",
            file=sys.stderr,
        )
        return EXIT_TAMPERED
    print(f"ok: {len(uids)} sessions, {total} records verified in {_shown(args.journal)}")
    return EXIT_OK


# -- export -----------------------------------------------------------------------------------


def _remove_sqlite_files(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(str(path) + suffix).unlink(missing_ok=True)


def _check_out(out: Path, *, force: bool) -> None:
    if out.exists() and not force:
        raise InputError(f"refusing to overwrite {out} (pass --force to replace it)")
    if out.exists() and not out.is_file():
        raise InputError(f"--out {out}: not a regular file")
    if not out.parent.is_dir():
        raise InputError(f"--out {out}: directory {out.parent} does not exist")


async def _export(args: argparse.Namespace) -> int:
    out = Path(args.out)
    _check_out(out, force=args.force)
    source = await _open_source(args.journal)
    # Written beside the target and renamed into place, so --out is either the old file or
    # a complete export, never half of one.
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}-{secrets.token_hex(4)}")
    exported = skipped = records_total = 0
    try:
        dest = await SqliteStore.open(partial)
        try:
            uids = await source.session_uids()
            with progress("exporting", total=len(uids), unit="sessions") as bar:
                for uid in uids:
                    bar.advance()
                    row = await source.get_session(uid)
                    if row is None:  # deleted: not part of the live journal
                        skipped += 1
                        continue
                    checked = await source.verify(uid)
                    records = await source.read(uid, 1, checked) if checked else []
                    await dest.import_records(row, records)
                    exported += 1
                    records_total += len(records)
            for registration in await source.list_harnesses():
                await dest.put_harness(registration)
        finally:
            await dest.close()
        os.replace(partial, out)
    except TamperedError as exc:
        _remove_sqlite_files(partial)
        print(
            f"FAILED: session {exc.session} seq {exc.seq}: {exc.why}; nothing exported",
            file=sys.stderr,
        )
        return EXIT_TAMPERED
    except BaseException:
        _remove_sqlite_files(partial)
        raise
    finally:
        await source.close()
    note = f" ({skipped} deleted sessions left out)" if skipped else ""
    print(f"ok: exported {exported} sessions, {records_total} records to {out}{note}")
    return EXIT_OK


# -- import -----------------------------------------------------------------------------------


async def _import(args: argparse.Namespace) -> int:
    fixture = Path(args.fixture)
    _check_existing_file(fixture, "fixture")
    try:
        loaded = await asyncio.to_thread(gojson.load_records, fixture)
    except OSError as exc:
        raise InputError(f"fixture {fixture}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # JSON syntax, UTF-8, or not the Go record shape
        raise InputError(f"fixture {fixture}: not a Go journal dump: {exc}") from None
    records = gojson.to_log_records(loaded)
    if not records:
        raise InputError(f"fixture {fixture}: holds no records")
    with progress(f"importing {len(records)} records", unit="") as bar:
        try:
            check_chain(str(fixture), records)
        except TamperedError as exc:
            print(
                f"FAILED: {fixture} record seq {exc.seq}: {exc.why}; nothing imported",
                file=sys.stderr,
            )
            return EXIT_TAMPERED
        bar.update(description=f"storing {len(records)} records")
        uid = args.session or "sess-" + secrets.token_hex(12)
        row = SessionRow(uid=uid, project=args.project, name=args.name, harness=args.harness)
        store = await _open(args.journal, create=True)
        try:
            stored = await store.import_records(row, records)
        finally:
            await store.close()
    print(
        f"ok: imported {stored.last_seq} records from {fixture} into session {uid} ({_shown(args.journal)})"
    )
    return EXIT_OK
