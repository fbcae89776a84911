"""Fixtures for the benchmarks' own tests: the run's PostgreSQL server (tests/journal/pg.py)."""

from __future__ import annotations

from tests.journal.pg import pg_server

__all__ = ["pg_server"]
