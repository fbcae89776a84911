"""Fixtures of the crash tests: the counting model endpoint and a started crash scenario."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.chaos.scenario import CrashScenario
from tests.support.chat_completions import ChatCompletionsServer, chat_completions_server


@pytest.fixture
def model_endpoint() -> Iterator[ChatCompletionsServer]:
    with chat_completions_server() as endpoint:
        yield endpoint


@pytest.fixture
async def scenario(tmp_path: Path, model_endpoint: ChatCompletionsServer) -> AsyncIterator[CrashScenario]:
    # A short directory of its own for the harness's unix socket (paths are capped near 108 bytes).
    socket_dir = Path(tempfile.mkdtemp(prefix="asc-", dir="/tmp"))
    world = CrashScenario(tmp_path, socket_dir, model_endpoint)
    try:
        await world.start()
        yield world
    finally:
        await world.close()
        shutil.rmtree(socket_dir, ignore_errors=True)
