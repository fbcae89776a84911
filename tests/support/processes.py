"""Harness processes for tests: ``agentsessions-harness serve TARGET --listen 127.0.0.1:0``."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

BIN = Path(sys.executable).parent
READY_PREFIX = "listening on "


class HarnessProcess:
    """A started harness process and the address it reported."""

    def __init__(self, process: asyncio.subprocess.Process, address: str) -> None:
        self.process = process
        self.address = address


@contextlib.asynccontextmanager
async def harness_process(
    argv: Sequence[str],
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    *,
    stdin: int | None = None,
) -> AsyncIterator[HarnessProcess]:
    """Start a harness process, wait for its ``listening on ADDRESS`` line, kill it on exit."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=stdin,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(60):
            line = (await process.stdout.readline()).decode()
        if not line.startswith(READY_PREFIX):
            assert process.stderr is not None
            async with asyncio.timeout(10):
                error = (await process.stderr.read()).decode()
            raise AssertionError(f"harness did not start: {line!r} {error}")
        yield HarnessProcess(process, line[len(READY_PREFIX) :].strip())
    finally:
        if process.returncode is None:
            process.kill()
            async with asyncio.timeout(30):
                await process.wait()


def serve_argv(target: str, listen: str = "127.0.0.1:0") -> list[str]:
    """The console-script command line serving ``module:Attr``."""
    return [str(BIN / "agentsessions-harness"), "serve", target, "--listen", listen]


async def stop(harness: HarnessProcess) -> int:
    harness.process.send_signal(signal.SIGTERM)
    async with asyncio.timeout(30):
        return await harness.process.wait()
