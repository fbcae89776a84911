"""Harness processes for tests: ``agentsessions-harness serve TARGET --listen 127.0.0.1:0``."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

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
    stderr_to: Path | None = None,
) -> AsyncIterator[HarnessProcess]:
    """Start a harness process, wait for its ``listening on ADDRESS`` line, kill it on exit.
    ``stderr_to``: its standard error goes to that file rather than a pipe (a long log, such as
    gRPC's trace, could fill a pipe nobody reads and stall the process)."""
    if stderr_to is None:
        process = await _spawn(argv, cwd, env, stdin, asyncio.subprocess.PIPE)
    else:
        with stderr_to.open("wb") as err:
            process = await _spawn(argv, cwd, env, stdin, err)
    try:
        assert process.stdout is not None
        async with asyncio.timeout(60):
            line = (await process.stdout.readline()).decode()
        if not line.startswith(READY_PREFIX):
            if process.stderr is None:
                error = f"(standard error in {stderr_to})"
            else:
                async with asyncio.timeout(10):
                    error = (await process.stderr.read()).decode()
            raise AssertionError(f"harness did not start: {line!r} {error}")
        yield HarnessProcess(process, line[len(READY_PREFIX) :].strip())
    finally:
        if process.returncode is None:
            process.kill()
            async with asyncio.timeout(30):
                await process.wait()


async def _spawn(
    argv: Sequence[str], cwd: Path | None, env: Mapping[str, str] | None, stdin: int | None, stderr: Any
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdin=stdin, stdout=asyncio.subprocess.PIPE, stderr=stderr
    )


def free_port() -> int:
    """A loopback TCP port free a moment ago, for a process that must be told its address."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def serve_argv(target: str, listen: str = "127.0.0.1:0") -> list[str]:
    """The console-script command line serving ``module:Attr``."""
    return [str(BIN / "agentsessions-harness"), "serve", target, "--listen", listen]


async def stop(harness: HarnessProcess) -> int:
    harness.process.send_signal(signal.SIGTERM)
    async with asyncio.timeout(30):
        return await harness.process.wait()
