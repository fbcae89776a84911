"""Journal locations: one parser (``journal.parse_location``), used by ``open_store`` and ``--journal``."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentsessions.host.config import ConfigError, HostConfig
from agentsessions.host.journal import (
    JournalLocation,
    JournalLocationError,
    PostgresURLError,
    SessionRow,
    open_store,
    parse_location,
)
from agentsessions.host.journal.memory import MemoryStore
from agentsessions.host.journal.sqlite import SqliteStore

ACCEPTED = [
    ("memory:", JournalLocation("memory", "")),
    ("agentsessions.db", JournalLocation("sqlite", "agentsessions.db")),
    ("/var/lib/agentsessions/journal.db", JournalLocation("sqlite", "/var/lib/agentsessions/journal.db")),
    ("./a:b.db", JournalLocation("sqlite", "./a:b.db")),
    ("sqlite:///var/j.db", JournalLocation("sqlite", "/var/j.db")),
    ("sqlite://j.db", JournalLocation("sqlite", "j.db")),
    ("postgres://u@localhost/db", JournalLocation("postgres", "postgres://u@localhost/db")),
    (
        "postgresql://u:pw@127.0.0.1:5432/db",
        JournalLocation("postgres", "postgresql://u:pw@127.0.0.1:5432/db"),
    ),
]

REFUSED = [
    ("", JournalLocationError, "journal location is empty"),
    ("sqlite://", JournalLocationError, "names no SQLite file"),
    ("mysql://localhost/db", JournalLocationError, "has scheme 'mysql'"),
    ("redis:", JournalLocationError, "has scheme 'redis'"),
    ("memory:extra", JournalLocationError, "has scheme 'memory'"),
    ("sqlite:j.db", JournalLocationError, "has scheme 'sqlite'"),
    ("postgresql://127.0.0.1:notaport/db", PostgresURLError, "port is not a number"),
    ("postgresql:///db", PostgresURLError, "no host"),
]


@pytest.mark.parametrize(("location", "expected"), ACCEPTED)
def test_each_form_means_one_thing(location: str, expected: JournalLocation) -> None:
    assert parse_location(location) == expected
    # --journal reads it the same way.
    assert HostConfig(journal=location).journal_kind == expected.kind


@pytest.mark.parametrize(("location", "kind", "why"), REFUSED)
def test_refusals_name_the_rule(location: str, kind: type[Exception], why: str) -> None:
    with pytest.raises(kind, match=why) as caught:
        parse_location(location)
    assert type(caught.value) is kind
    with pytest.raises(ConfigError, match=f"--journal: .*{why}"):
        HostConfig(journal=location)


def test_a_password_is_never_echoed() -> None:
    with pytest.raises(PostgresURLError) as caught:
        parse_location("postgresql://user:hunter2@127.0.0.1:notaport/db")
    assert "hunter2" not in str(caught.value)


async def test_open_store_follows_the_parser(tmp_path: Path) -> None:
    assert isinstance(await open_store("memory:"), MemoryStore)
    path = tmp_path / "j.db"
    store = await open_store(f"sqlite://{path}")
    try:
        assert isinstance(store, SqliteStore) and store.path == str(path)
        await store.create_session(SessionRow(uid="s", project="p"))
    finally:
        await store.close()
    reopened = await open_store(str(path))
    try:
        assert await reopened.get_session("s") is not None
    finally:
        await reopened.close()
    for bad in ("sqlite://", "mysql://localhost/db"):
        with pytest.raises(JournalLocationError):
            await open_store(bad)
    assert not (tmp_path / "mysql:").exists()
