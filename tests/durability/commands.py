"""Running the ``agentsessions`` command: as its own process (``agentsessions``), or through its
entry point in this process (``in_process``, output captured by pytest's ``capsys``)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentsessions.host import cli

AGENTSESSIONS = Path(sys.executable).parent / "agentsessions"


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str


def clean_environment() -> dict[str, str]:
    """The test's environment without host settings or provider keys that would change a run."""
    dropped = ("MODEL_API_KEY", "OPENAI_API_KEY")
    return {k: v for k, v in os.environ.items() if not k.startswith("AGENTSESSIONS_") and k not in dropped}


async def agentsessions(*args: str | Path) -> Run:
    """Run ``agentsessions ARGS`` to completion (bounded) while this event loop keeps serving."""
    process = await asyncio.create_subprocess_exec(
        str(AGENTSESSIONS),
        *[str(a) for a in args],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=clean_environment(),
    )
    try:
        async with asyncio.timeout(60):
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return Run(process.returncode, out.decode(), err.decode())


# Runs ``agentsessions ARGS`` through ``cli.main`` in a worker thread (it runs its own event loop).
Command = Callable[..., Awaitable[Run]]


def in_process(capsys: pytest.CaptureFixture[str]) -> Command:
    async def run(*args: str | Path) -> Run:
        capsys.readouterr()
        code = await asyncio.to_thread(cli.main, [str(a) for a in args])
        out, err = capsys.readouterr()
        return Run(code, out, err)

    return run
