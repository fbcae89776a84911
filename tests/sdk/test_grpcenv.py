"""The gRPC transport the two commands choose (``agentsessions.sdk.grpcenv``).

The choice itself is a function of the environment and the loaded modules. Whether the commands'
processes really run on gRPC core's own I/O manager is read from gRPC core's ``tcp`` trace: the I/O
manager logs from ``tcp_server_posix.cc`` (a listener) and ``tcp_client_posix.cc`` (a connection
made), the EventEngine from its ``posix_endpoint`` files instead. The installed grpcio must know
the experiments' names: it logs ``Unknown experiment`` for one it does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import grpc
import pytest
from grpc import aio

from agentsessions.host.harnesslink import RemoteHarness
from agentsessions.sdk.grpcenv import LEGACY_IO, VARIABLE, choose_transport
from agentsessions.v1 import common_pb2, session_pb2, session_pb2_grpc
from tests.support.host_process import repo_env
from tests.support.processes import BIN, free_port, harness_process, serve_argv, stop

LISTENER = "tcp_server_posix.cc"
CONNECTOR = "tcp_client_posix.cc"
UNKNOWN = "Unknown experiment"


def test_the_commands_turn_the_event_engine_off_when_nothing_chose() -> None:
    environ: dict[str, str] = {}
    assert choose_transport(environ, {}) == LEGACY_IO
    assert environ == {VARIABLE: "-event_engine_client,-event_engine_listener"}


@pytest.mark.parametrize("value", ["", "event_engine_client", "-event_engine_listener"])
def test_an_operators_setting_wins_even_an_empty_one(value: str) -> None:
    environ = {VARIABLE: value}
    assert choose_transport(environ, {}) is None
    assert environ == {VARIABLE: value}


def test_nothing_is_set_once_grpc_is_loaded() -> None:
    environ: dict[str, str] = {}
    assert choose_transport(environ, {"grpc": object()}) is None
    assert environ == {}


def test_the_process_environment_is_the_default() -> None:
    # This process imported grpc long ago, so the call must leave os.environ alone.
    before = os.environ.get(VARIABLE)
    assert choose_transport() is None
    assert os.environ.get(VARIABLE) == before


def _traced(overrides: Mapping[str, str | None]) -> dict[str, str]:
    env = repo_env()
    env.pop(VARIABLE, None)
    env.update({"GRPC_VERBOSITY": "debug", "GRPC_TRACE": "tcp"})
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@contextlib.asynccontextmanager
async def _process(argv: list[str], env: dict[str, str], log: Path) -> AsyncIterator[str]:
    """A harness with its standard error (gRPC's trace) in ``log``; yields its address and stops it
    with SIGTERM, which it must answer with a clean exit."""
    async with harness_process(argv, log.parent, env, stderr_to=log) as served:
        yield served.address
        assert await stop(served) == 0


def _text(log: Path) -> str:
    return log.read_text(errors="replace")


def _harness_argv() -> list[str]:
    return serve_argv("agentsessions.harnesses.echo:EchoHarness")


async def _describe(address: str) -> str:
    remote = RemoteHarness(address)
    try:
        return (await remote.describe()).id
    finally:
        await remote.close()


@pytest.mark.e2e
async def test_the_harness_command_serves_on_the_io_manager(tmp_path: Path) -> None:
    log = tmp_path / "harness.log"
    async with _process(_harness_argv(), _traced({}), log) as address:
        assert await _describe(address) == "echo"
    trace = _text(log)
    assert UNKNOWN not in trace
    assert LISTENER in trace


@pytest.mark.e2e
async def test_an_empty_setting_keeps_grpcs_event_engine(tmp_path: Path) -> None:
    log = tmp_path / "harness.log"
    async with _process(_harness_argv(), _traced({VARIABLE: ""}), log) as address:
        assert await _describe(address) == "echo"
    trace = _text(log)
    assert "tcp" in trace  # the trace is on: the EventEngine's endpoints log under it
    assert LISTENER not in trace


@pytest.mark.e2e
async def test_the_host_serves_and_reaches_its_harness_on_the_io_manager(tmp_path: Path) -> None:
    async with _process(_harness_argv(), _traced({"GRPC_TRACE": None}), tmp_path / "harness.log") as harness:
        address = f"127.0.0.1:{free_port()}"
        argv = [
            str(BIN / "agentsessions"),
            "serve",
            "--listen",
            address,
            "--journal",
            "memory:",
            "--harness",
            f"echo-remote={harness}",
        ]
        log = tmp_path / "host.log"
        with log.open("wb") as err:
            host = await asyncio.create_subprocess_exec(
                *argv, env=_traced({}), stdout=asyncio.subprocess.DEVNULL, stderr=err, cwd=tmp_path
            )
        try:
            async with aio.insecure_channel(address) as channel:
                async with asyncio.timeout(60):
                    await channel.channel_ready()
                stub = session_pb2_grpc.SessionsStub(channel)
                created = await stub.CreateSession(
                    session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="echo-remote"))
                )
                text = common_pb2.Part(text=common_pb2.TextPart(text="hi"))
                request = session_pb2.ExecRequest(
                    session=created.metadata.uid, inputs=[common_pb2.Message(role="user", parts=[text])]
                )
                kinds = [u.record.event.kind async for u in stub.Exec(request) if u.HasField("record")]
            assert kinds[-1] == common_pb2.EVENT_END
        except grpc.RpcError as exc:
            raise AssertionError(f"{exc}\n{_text(log)[-3000:]}") from exc
        finally:
            host.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                await host.wait()
    trace = _text(log)
    assert UNKNOWN not in trace
    assert LISTENER in trace  # its Sessions service
    assert CONNECTOR in trace  # its connection to the harness
    # The serving line tells an operator what gRPC core read.
    assert f" grpc_experiments={LEGACY_IO} " in trace
