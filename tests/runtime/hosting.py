"""A host built by ``build_app`` (as ``agentsessions serve`` builds it) on a loopback port, for the
runtime tests; plus the bounded waits they share."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from grpc import aio

from agentsessions.host.app import App, build_app
from agentsessions.host.config import HostConfig
from agentsessions.host.runtime import ProcessRuntime
from agentsessions.v1 import common_pb2, harness_registry_pb2_grpc, session_pb2, session_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0


@dataclass
class ServedApp:
    app: App
    sessions: session_pb2_grpc.SessionsStub
    registry: harness_registry_pb2_grpc.HarnessRegistryStub

    async def process_runtime(self, name: str) -> ProcessRuntime:
        assert self.app.controller is not None
        resolved = await self.app.controller.catalog.resolve(name)
        runtime = resolved.placed_on()
        assert isinstance(runtime, ProcessRuntime)
        return runtime

    async def records(self, uid: str) -> list[common_pb2.LogRecord]:
        return [r async for r in self.sessions.Replay(session_pb2.ReplayRequest(session=uid))]


@contextlib.asynccontextmanager
async def served_app(config: HostConfig) -> AsyncIterator[ServedApp]:
    """Serve the app's Sessions and HarnessRegistry on 127.0.0.1:0; close the app on exit (which
    stops any harness processes it started). Harness processes run with the repository as cwd, so
    ``tests.runtime.harnesses`` targets import."""
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        app = await build_app(config)
    except BaseException:
        os.chdir(cwd)
        raise
    server = aio.server()
    try:
        for service in [*app.services, *app.admin_services]:
            service.add_to_server(server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield ServedApp(
                app,
                session_pb2_grpc.SessionsStub(channel),
                harness_registry_pb2_grpc.HarnessRegistryStub(channel),
            )
    finally:
        await server.stop(None)
        await app.close()
        os.chdir(cwd)


def text_input(text: str) -> common_pb2.Message:
    return common_pb2.Message(role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text=text))])


def output_texts(records: list[common_pb2.LogRecord]) -> list[str]:
    return [
        "".join(p.text.text for p in r.event.message.parts)
        for r in records
        if r.event.kind == common_pb2.EVENT_OUTPUT
    ]


def pid_is_gone(pid: int) -> bool:
    """True when no process (not even a zombie) has this pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def parent_pid(pid: int) -> int:
    # /proc/<pid>/stat is "pid (comm) state ppid ..."; comm may hold spaces, so split after ')'.
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def harness_children() -> set[int]:
    """Pids of live harness processes (``agentsessions.sdk.cli``) whose parent is this process."""
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if parent_pid(int(entry.name)) != os.getpid():
                continue
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if b"agentsessions.sdk.cli" in command:
            found.add(int(entry.name))
    return found
