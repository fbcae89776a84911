"""Fixtures of the Cancel and DeleteSession tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.processes import HarnessProcess, harness_process, serve_argv

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def blocker_process(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[HarnessProcess]:
    """BlockingHarness in its own process."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    async with harness_process(serve_argv("tests.approvals.harnesses:BlockingHarness")) as proc:
        yield proc
