"""PostgreSQL for the hostile-input tests (a fresh database per test: tests/journal/pg.py)."""

from tests.journal.pg import pg_server, pg_url

__all__ = ["pg_server", "pg_url"]
