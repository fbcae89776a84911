"""Real host and harness processes that a test can ``kill -9`` and start again.

:class:`HostProcess` runs ``agentsessions serve --listen 127.0.0.1:0 --log-format json`` over a
journal the test owns and learns its address from the ``serving`` log line; ``start`` after
``kill`` brings up a new incarnation on the same journal (on a new port). :class:`HarnessProcess`
runs ``agentsessions-harness serve`` on a fixed address (a unix socket), so a restarted harness is
found where the host was told it lives. Both get the repo root on PYTHONPATH, so ``tests.support``
modules can be served and used as tool executors. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from grpc import aio

from agentsessions.v1 import session_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
STARTUP_LIMIT_S = 60.0
EXIT_LIMIT_S = 30.0
READY_PREFIX = "listening on "


def repo_env() -> dict[str, str]:
    """The environment for a child process that imports ``tests.support``; no provider keys."""
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_API_KEY", "OPENAI_API_KEY")}
    existing = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{existing}" if existing else str(ROOT)
    return env


async def _wait_exit(process: asyncio.subprocess.Process) -> int:
    async with asyncio.timeout(EXIT_LIMIT_S):
        return await process.wait()


def _serving_address(line: bytes) -> str | None:
    """The listen address from the host's JSON ``serving`` log line, if ``line`` is that line."""
    if not line.startswith(b"{"):
        return None
    entry = json.loads(line)
    return str(entry["listen"]) if entry.get("msg") == "serving" else None


class HostProcess:
    """``agentsessions serve`` over one journal, restartable; ``sessions`` talks to the live one."""

    def __init__(
        self, journal: Path | str, log_dir: Path, args: Sequence[str] = (), *, name: str = "host"
    ) -> None:
        self.name = name
        self.journal = journal
        self.log_dir = log_dir
        self.args = list(args)
        self.incarnation = 0
        self.process: asyncio.subprocess.Process | None = None
        self.address = ""
        self._log_task: asyncio.Task[None] | None = None
        self.log_lines: list[str] = []  # the current incarnation's log, also in log_path
        self._channel: aio.Channel | None = None
        self._sessions: session_pb2_grpc.SessionsStub | None = None

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}-{self.incarnation}.log"

    @property
    def sessions(self) -> session_pb2_grpc.SessionsStub:
        assert self._sessions is not None, "the host is not running"
        return self._sessions

    async def start(self) -> None:
        """Start a new incarnation and wait (bounded) until it reports its listen address."""
        assert self.process is None or self.process.returncode is not None, "the host is already running"
        await self._close_channel()
        self.incarnation += 1
        argv = [
            str(BIN / "agentsessions"),
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--journal",
            str(self.journal),
            "--log-format",
            "json",
            *self.args,
        ]
        self.process = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=repo_env(),
            cwd=self.log_dir,
        )
        serving: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.log_lines = []
        self._log_task = asyncio.create_task(self._keep_log(self.process, serving))
        try:
            async with asyncio.timeout(STARTUP_LIMIT_S):
                self.address = await serving
        except TimeoutError:
            await self.close()
            raise AssertionError(
                f"host did not serve within {STARTUP_LIMIT_S} s:\n{''.join(self.log_lines)}"
            ) from None
        self._channel = aio.insecure_channel(self.address)
        self._sessions = session_pb2_grpc.SessionsStub(self._channel)

    async def _keep_log(self, process: asyncio.subprocess.Process, serving: asyncio.Future[str]) -> None:
        """Copy the host's log to ``log_path`` (draining the pipe) and report the serving address."""
        assert process.stdout is not None
        with self.log_path.open("wb") as log:
            async for line in process.stdout:
                log.write(line)
                log.flush()
                self.log_lines.append(line.decode(errors="replace"))
                address = _serving_address(line)
                if address is not None and not serving.done():
                    serving.set_result(address)
        if not serving.done():
            code = await process.wait()
            serving.set_exception(
                AssertionError(f"host exited {code} before serving:\n{''.join(self.log_lines)}")
            )

    async def _close_channel(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._sessions = None

    async def _reap(self) -> int:
        assert self.process is not None
        code = await _wait_exit(self.process)
        if self._log_task is not None:
            async with asyncio.timeout(EXIT_LIMIT_S):
                await self._log_task
            self._log_task = None
        return code

    async def kill(self) -> None:
        """``kill -9`` the running incarnation and wait for it to be gone (calls in flight on
        ``sessions`` then fail as a client of a vanished host sees it)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        await self._reap()

    async def stop(self) -> int:
        """SIGTERM (a graceful drain); returns the exit code."""
        await self._close_channel()
        if self.process is None:
            return 0
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        return await self._reap()

    async def close(self) -> None:
        """Make sure no incarnation outlives the test."""
        await self._close_channel()
        if self.process is not None:
            if self.process.returncode is None:
                self.process.kill()
            await self._reap()


class HarnessProcess:
    """``agentsessions-harness serve TARGET`` on a fixed address, restartable there."""

    def __init__(self, target: str, address: str, log_dir: Path) -> None:
        self.target = target
        self.address = address
        self.log_dir = log_dir
        self.incarnation = 0
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        assert self.process is None or self.process.returncode is not None, "the harness is already running"
        self.incarnation += 1
        argv = [str(BIN / "agentsessions-harness"), "serve", self.target, "--listen", self.address]
        log_path = self.log_dir / f"harness-{self.incarnation}.log"
        with log_path.open("wb") as log:
            self.process = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.PIPE, stderr=log, env=repo_env(), cwd=self.log_dir
            )
        assert self.process.stdout is not None
        try:
            async with asyncio.timeout(STARTUP_LIMIT_S):
                line = (await self.process.stdout.readline()).decode()
        except TimeoutError:
            line = f"nothing within {STARTUP_LIMIT_S} s"
        if not line.startswith(READY_PREFIX):
            await self.close()
            raise AssertionError(f"harness did not start: {line!r}\n{log_path.read_text()}")

    async def kill(self) -> None:
        """``kill -9`` the harness and wait for it to be gone."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        await _wait_exit(self.process)

    async def close(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await _wait_exit(self.process)
