"""Listing benchmark: a ListSessions page of 100 among 10,000 sessions against its SQL.

Issue #13's goal: a page within 3x the SQL that selects it. The journal is SQLite (FULL), 10,000
sessions, one echo turn in every tenth so the pages mix execution states. Four figures per page,
the whole listing paged through (100 pages) each round, the four interleaved page by page so they
see the machine at the same moments; best of the rounds:

* **SQL**: the page's own query (the store's columns, its order and keyset condition), run with
  ``sqlite3`` on a connection of its own to the same file, rows fetched: the floor of any listing.
* **host, every row changed**: ``Controller.list_sessions`` plus the servicer's encoding of the
  page (``SessionsServicer.encode_page``), in process, with nothing kept from the pages before it
  (the store's decoded rows and the servicer's encoded Sessions cleared before each page): what a
  page costs when every session on it changed since it was last listed. The goal's figure.
* **host, rows unchanged**: the same, with what the pages before it kept: a console or a lister
  paging again through sessions that did not change meanwhile.
* **gRPC**: ``Sessions/ListSessions`` over loopback to a real in-process gRPC server: the above
  plus the call's transport and the client's decoding (a diagnostic: the goal is the host's work).

With a PostgreSQL server URL in ``AGENTSESSIONS_BENCH_PG_URL`` (or ``AGENTSESSIONS_TEST_PG_URL``;
``scripts/pg-test-cluster.sh start DIR`` prints one) the same four figures are measured on a
scratch database there too, its SQL the PostgreSQL store's own page query run with asyncpg (a
diagnostic: the goal is SQLite's, the embedded default).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import asyncpg
from grpc import aio

from agentsessions.host.controller.turns import ExecParams
from agentsessions.host.journal import decode_page_token, open_store
from agentsessions.host.journal.postgres import _SESSION_COLUMNS
from agentsessions.host.journal.sqlite import _ROW_COLUMNS
from agentsessions.host.journal.store import SessionRow
from agentsessions.host.service.sessions import SessionsServicer, add_to_server
from agentsessions.sdk.harness import text_message
from agentsessions.v1 import session_pb2, session_pb2_grpc
from bench import replay, resultfile
from bench.journal import PG_URL_ENVS, scratch_postgres

RESULTS: Final = Path(__file__).resolve().parent / "results" / "listing.json"
PAGE: Final = 100
GOAL_RATIO: Final = 3.0
PROJECT: Final = "default"


async def _build(location: str, sessions: int) -> None:
    """``sessions`` sessions, a turn in every tenth (SQLite built with synchronous=OFF: not timed)."""
    store = await open_store(location, **({} if location.startswith("postgres") else {"synchronous": "OFF"}))
    try:
        controller = replay.echo_host(store)
        for i in range(sessions):
            view = await controller.create_session(SessionRow(uid="", project="", harness="echo"))
            if i % 10 == 0:
                params = ExecParams(session=view.row.uid, inputs=[text_message("user", f"hello {i}")])
                async with controller.admit_exec(params) as turn:
                    async for _ in turn.run():
                        pass
    finally:
        await store.close()


def _sql_page(db: sqlite3.Connection, token: str) -> int:
    """The SQLite store's page query for ``token`` (one row more than the page, as the store asks,
    to know whether another page follows); the rows fetched."""
    if not token:
        rows = db.execute(
            f"SELECT {_ROW_COLUMNS} FROM sessions WHERE project = ? AND deleted = 0 "
            "ORDER BY created_at DESC, session ASC LIMIT ?",
            (PROJECT, PAGE + 1),
        ).fetchall()
    else:
        created, uid = decode_page_token(token)
        rows = db.execute(
            f"SELECT {_ROW_COLUMNS} FROM sessions WHERE project = ? AND deleted = 0 "
            "AND (created_at < ? OR (created_at = ? AND session > ?)) "
            "ORDER BY created_at DESC, session ASC LIMIT ?",
            (PROJECT, created, created, uid, PAGE + 1),
        ).fetchall()
    return len(rows)


async def _pg_page(conn: Any, token: str) -> int:
    """The PostgreSQL store's page query for ``token``, the same way; the rows fetched."""
    if not token:
        rows = await conn.fetch(
            f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE project = $1 AND deleted_at IS NULL "
            "ORDER BY created_at DESC, uid ASC LIMIT $2",
            PROJECT,
            PAGE + 1,
        )
    else:
        created, uid = decode_page_token(token)
        rows = await conn.fetch(
            f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE project = $1 AND deleted_at IS NULL "
            "AND (created_at < $2 OR (created_at = $2 AND uid > $3)) "
            "ORDER BY created_at DESC, uid ASC LIMIT $4",
            PROJECT,
            created,
            uid,
            PAGE + 1,
        )
    return len(rows)


@contextlib.asynccontextmanager
async def _sql_for(location: str) -> AsyncIterator[Callable[[str], Awaitable[int]]]:
    """The page's own SQL on a connection of its own to the store at ``location``."""
    if location.startswith("postgres"):
        conn = await asyncpg.connect(location)
        try:
            yield lambda token: _pg_page(conn, token)
        finally:
            await conn.close()
        return
    db = sqlite3.connect(location)

    async def page(token: str) -> int:
        return _sql_page(db, token)

    try:
        yield page
    finally:
        db.close()


async def _measure(location: str, rounds: int) -> dict[str, float]:
    async with _sql_for(location) as sql_page:
        return await _measure_with(location, sql_page, rounds)


async def _measure_with(
    location: str, sql_page: Callable[[str], Awaitable[int]], rounds: int
) -> dict[str, float]:
    store = await open_store(location)
    server = aio.server()
    controller = replay.echo_host(store)
    servicer = SessionsServicer(controller)
    add_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = aio.insecure_channel(f"127.0.0.1:{port}")
    stub = session_pb2_grpc.SessionsStub(channel)
    listed = store._dialect.listed  # type: ignore[attr-defined]
    best = {"sql": float("inf"), "host": float("inf"), "kept": float("inf"), "grpc": float("inf")}
    pages = 0

    async def host_page(token: str) -> tuple[bytes, str]:
        views, next_token = await controller.list_sessions(PROJECT, PAGE, token)
        return servicer.encode_page(views, next_token), next_token

    try:
        for _ in range(rounds):
            spent = {"sql": 0.0, "host": 0.0, "kept": 0.0, "grpc": 0.0}
            token = ""
            pages = 0
            while True:
                t = time.perf_counter()
                await sql_page(token)
                spent["sql"] += time.perf_counter() - t

                listed.clear()
                servicer.wires.clear()
                t = time.perf_counter()
                cold, next_token = await host_page(token)
                spent["host"] += time.perf_counter() - t

                t = time.perf_counter()
                warm, _ = await host_page(token)
                spent["kept"] += time.perf_counter() - t
                assert warm == cold

                t = time.perf_counter()
                answered = await stub.ListSessions(
                    session_pb2.ListSessionsRequest(project=PROJECT, page_size=PAGE, page_token=token)
                )
                spent["grpc"] += time.perf_counter() - t

                assert answered == session_pb2.ListSessionsResponse.FromString(cold)
                pages += 1
                token = next_token
                if not token:
                    break
            for key, value in spent.items():
                best[key] = min(best[key], value / pages)
    finally:
        await channel.close()
        await server.stop(None)
        await store.close()
    return {"pages": float(pages), **{f"{k}_ms_per_page": v * 1000 for k, v in best.items()}}


def _report(name: str, sessions: int, rounds: int, m: dict[str, float]) -> dict[str, Any]:
    ratio = m["host_ms_per_page"] / m["sql_ms_per_page"]
    kept = m["kept_ms_per_page"] / m["sql_ms_per_page"]
    print(f"\nListSessions, pages of {PAGE} among {sessions} sessions ({name}), best of {rounds} rounds")
    print(f"  SQL: the page's query, rows fetched   {m['sql_ms_per_page']:7.3f} ms per page")
    print(f"  host, every row changed               {m['host_ms_per_page']:7.3f} ms   {ratio:5.2f}x SQL")
    print(f"  host, rows unchanged (kept)           {m['kept_ms_per_page']:7.3f} ms   {kept:5.2f}x SQL")
    print(f"  gRPC over loopback (diagnostic)       {m['grpc_ms_per_page']:7.3f} ms")
    return {"results": m, "ratio_host_to_sql": ratio, "ratio_kept_to_sql": kept}


async def _postgres(admin: str, sessions: int, rounds: int) -> dict[str, float]:
    async with scratch_postgres(admin) as url:
        await _build(url, sessions)
        return await _measure(url, rounds)


def run(*, quick: bool, out: Path = RESULTS) -> int:
    sessions = 1_000 if quick else 10_000
    rounds = 2 if quick else 5
    with tempfile.TemporaryDirectory(prefix="agentsessions-bench-listing-") as tmp:
        path = str(Path(tmp) / "listing.db")
        asyncio.run(_build(path, sessions))
        m = asyncio.run(_measure(path, rounds))
    sqlite = _report("SQLite", sessions, rounds, m)
    met = sqlite["ratio_host_to_sql"] <= GOAL_RATIO
    verdict = "met" if met else "MISSED"
    if quick:
        verdict += " (quick run: not a measurement)"
    print(f"  goal host, every row changed <= {GOAL_RATIO:g}x SQL: {verdict}")
    admin = next((os.environ[e].strip() for e in PG_URL_ENVS if os.environ.get(e, "").strip()), "")
    postgres: dict[str, Any] = {"skipped": f"set {PG_URL_ENVS[0]} to a server URL to measure it"}
    if admin:
        postgres = _report("PostgreSQL", sessions, rounds, asyncio.run(_postgres(admin, sessions, rounds)))
    else:
        print(f"\nPostgreSQL not measured: {postgres['skipped']}")
    document = {
        "benchmark": "listing",
        "when_unix": int(time.time()),
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "quick": quick,
        "sessions": sessions,
        **sqlite,
        "goal": {"ratio_at_most": GOAL_RATIO, "met": met},
        "postgres": postgres,
    }
    resultfile.write(out, document)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(quick="--quick" in sys.argv[1:]))
