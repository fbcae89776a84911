"""Fixtures of the crash tests: the counting model endpoint and a started crash scenario."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.chaos.scenario import CrashScenario, started
from tests.support.chat_completions import ChatCompletionsServer, chat_completions_server


@pytest.fixture
def model_endpoint() -> Iterator[ChatCompletionsServer]:
    with chat_completions_server() as endpoint:
        yield endpoint


@pytest.fixture
async def scenario(tmp_path: Path, model_endpoint: ChatCompletionsServer) -> AsyncIterator[CrashScenario]:
    async with started(CrashScenario, tmp_path, model_endpoint) as world:
        yield world
