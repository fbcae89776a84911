"""Fixtures of the durability tests: a SQLite journal, a counting echo model, the echo harness
served over Harness.Connect on loopback, a host on a loopback port wired to all three, and the
``agentsessions`` command run in this process."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentsessions.harnesses.echo import EchoHarness
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.models.echo import EchoModel
from tests.durability.commands import Command, in_process
from tests.durability.harnesses import served
from tests.durability.models import CountingModel
from tests.support.host import HostUnderTest, counting_ids, running_host


@pytest.fixture
def model() -> CountingModel:
    return CountingModel(EchoModel())


@pytest.fixture
async def wire_echo() -> AsyncIterator[str]:
    async with served(EchoHarness()) as address:
        yield address


@pytest.fixture
async def host(store: JournalStore, wire_echo: str, model: CountingModel) -> AsyncIterator[HostUnderTest]:
    async with running_host(store, remote={"wire-echo": wire_echo}, model=model, new_id=counting_ids()) as h:
        yield h


@pytest.fixture
def command(capsys: pytest.CaptureFixture[str]) -> Command:
    """``await command("replay", "--journal", ...)``: the agentsessions command, run in this process."""
    return in_process(capsys)
