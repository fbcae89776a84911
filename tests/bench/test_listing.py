"""The listing benchmark's measurement on a small journal of each SQL store: every page the host
builds (with nothing kept, and with what the page before it kept) is the page gRPC answers."""

from __future__ import annotations

from pathlib import Path

from bench import listing
from tests.journal.pg import PgServer


async def _measured(location: str) -> dict[str, float]:
    await listing._build(location, 250)
    return await listing._measure(location, 1)


def _check(m: dict[str, float]) -> None:
    assert m["pages"] == 3
    for figure in ("sql", "host", "kept", "grpc"):
        assert m[f"{figure}_ms_per_page"] > 0


async def test_the_listing_measure_on_sqlite(tmp_path: Path) -> None:
    _check(await _measured(str(tmp_path / "listing.db")))


async def test_the_listing_measure_on_postgres(pg_server: PgServer) -> None:
    url = await pg_server.create_database()
    try:
        _check(await _measured(url))
    finally:
        await pg_server.drop_database(url)
