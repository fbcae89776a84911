"""PostgreSQL for the journal tests: one server per test run, a fresh database per test.

The server is ``AGENTSESSIONS_TEST_PG_URL`` when set (its role needs CREATEDB), else a
throwaway cluster that ``scripts/pg-test-cluster.sh`` starts on 127.0.0.1 when PostgreSQL
server binaries are installed. With neither, PostgreSQL tests are skipped, except when the
``CI`` environment variable is set: there a missing PostgreSQL fails the run.

Import the fixtures into a conftest: ``from tests.journal.pg import pg_server, pg_url``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

URL_ENV = "AGENTSESSIONS_TEST_PG_URL"
REPO = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = REPO / "scripts" / "pg-test-cluster.sh"
# Bounds for everything that waits on the server.
START_TIMEOUT_S = 120.0
ADMIN_TIMEOUT_S = 30.0


class PgServer:
    """A PostgreSQL server the tests may create and drop databases on."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url

    def database_url(self, database: str) -> str:
        """The admin URL pointed at another database (same host, port, credentials, options)."""
        parts = urllib.parse.urlsplit(self.admin_url)
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, ""))

    async def create_database(self) -> str:
        """Create an empty database with a unique name; returns its URL."""
        name = "agentsessions_test_" + secrets.token_hex(6)
        conn = await asyncpg.connect(self.admin_url, timeout=ADMIN_TIMEOUT_S)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"', timeout=ADMIN_TIMEOUT_S)
        finally:
            await conn.close(timeout=ADMIN_TIMEOUT_S)
        return self.database_url(name)

    async def drop_database(self, url: str) -> None:
        """Drop a database made by create_database, disconnecting anything still attached."""
        name = urllib.parse.urlsplit(url).path.lstrip("/")
        if not name.startswith("agentsessions_test_"):
            raise ValueError(f"refusing to drop {name!r}: not a test database")
        conn = await asyncpg.connect(self.admin_url, timeout=ADMIN_TIMEOUT_S)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', timeout=ADMIN_TIMEOUT_S)
        finally:
            await conn.close(timeout=ADMIN_TIMEOUT_S)


def unavailable(reason: str) -> None:
    """Skip, or fail under CI, because PostgreSQL cannot be had."""
    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL is required when CI is set: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL not available: {reason}")


def _server_binaries() -> str | None:
    found = subprocess.run(
        [str(CLUSTER_SCRIPT), "bindir"], capture_output=True, text=True, timeout=30, check=False
    )
    return found.stdout.strip() if found.returncode == 0 else None


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """The run's PostgreSQL server (see the module docstring for where it comes from)."""
    url = os.environ.get(URL_ENV, "").strip()
    if url:
        yield PgServer(url)
        return
    if _server_binaries() is None:
        unavailable(f"{URL_ENV} is unset and no PostgreSQL server binaries are installed")
    # Under /tmp so the unprivileged server account can reach it when tests run as root.
    workdir = tempfile.mkdtemp(prefix="agentsessions-pg-", dir="/tmp" if os.path.isdir("/tmp") else None)
    try:
        try:
            started = subprocess.run(
                [str(CLUSTER_SCRIPT), "start", workdir],
                capture_output=True,
                text=True,
                timeout=START_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            unavailable(f"the throwaway cluster did not start within {START_TIMEOUT_S:.0f} s")
        if started.returncode != 0:
            unavailable(f"the throwaway cluster did not start: {started.stderr.strip()}")
        yield PgServer(started.stdout.strip().splitlines()[-1])
    finally:
        subprocess.run(
            [str(CLUSTER_SCRIPT), "stop", workdir],
            capture_output=True,
            timeout=START_TIMEOUT_S,
            check=False,
        )
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
async def pg_url(pg_server: PgServer) -> AsyncIterator[str]:
    """A fresh, empty database for one test, dropped afterwards."""
    url = await pg_server.create_database()
    try:
        yield url
    finally:
        await pg_server.drop_database(url)
