"""The host as an operator runs it: a real ``agentsessions serve`` process on a loopback port, driven
by the real grpcurl binary with no proto files (everything it knows comes from server reflection).
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from agentsessions.v1 import session_pb2
from tests.support.processes import free_port

pytestmark = pytest.mark.e2e

BIN = Path(sys.executable).parent
GRPCURL = BIN / "grpcurl"
STARTUP_TIMEOUT = 60.0
CALL_TIMEOUT = 60.0


@dataclass
class Host:
    process: subprocess.Popen[bytes]
    address: str
    log_path: Path
    registry_address: str = ""

    def log_text(self) -> str:
        return self.log_path.read_text()

    def json_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log_text().splitlines() if line.startswith("{")]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=CALL_TIMEOUT)


def start_host(
    tmp: Path,
    *,
    command: Sequence[str] = (str(BIN / "agentsessions"), "serve"),
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    listen: str | None = None,
) -> Host:
    """Start a host the way ``make run`` does, and return once its health check answers SERVING."""
    address = listen or f"127.0.0.1:{free_port()}"
    argv = [*command, "--journal", str(tmp / "journal.db"), *args]
    if listen is None:
        argv += ["--listen", address]
    log_path = tmp / "host.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            argv, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=tmp
        )
    host = Host(process, address, log_path)
    try:
        wait_serving(host)
    except BaseException:
        process.kill()
        process.wait(timeout=CALL_TIMEOUT)
        raise
    return host


def wait_serving(host: Host) -> None:
    """Bounded: a health Check that waits for the channel, raced against the process exiting."""
    with grpc.insecure_channel(host.address) as channel:
        ready = grpc.channel_ready_future(channel)
        for _ in range(int(STARTUP_TIMEOUT * 10)):
            if host.process.poll() is not None:
                pytest.fail(f"host exited {host.process.returncode} before serving:\n{host.log_text()}")
            try:
                ready.result(timeout=0.1)
                break
            except grpc.FutureTimeoutError:
                continue
        else:
            pytest.fail(f"host did not accept connections:\n{host.log_text()}")
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def grpcurl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(GRPCURL), "-plaintext", *args],
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT,
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    registry = f"127.0.0.1:{free_port()}"
    running = start_host(
        tmp_path_factory.mktemp("host"), args=["--log-format", "json", "--registry-addr", registry]
    )
    running.registry_address = registry
    yield running
    assert running.stop() == 0


@pytest.fixture
def empty_dir(tmp_path: Path) -> Path:
    """grpcurl runs here, where there is no .proto file to find."""
    return tmp_path


def test_reflection_lists_the_services_without_proto_files(host: Host, empty_dir: Path) -> None:
    listed = grpcurl(host.address, "list", cwd=empty_dir)
    assert listed.returncode == 0, listed.stderr
    services = set(listed.stdout.split())
    assert {
        "agentsessions.v1.Sessions",
        "agentsessions.ext.v1.LiveSessions",
        "grpc.health.v1.Health",
    } <= services
    # The registry is an admin API on its own listener, never on the Sessions port.
    assert "agentsessions.v1.HarnessRegistry" not in services


def test_reflection_lists_every_sessions_rpc(host: Host, empty_dir: Path) -> None:
    listed = grpcurl(host.address, "list", "agentsessions.v1.Sessions", cwd=empty_dir)
    assert listed.returncode == 0, listed.stderr
    expected = {
        f"agentsessions.v1.Sessions.{method.name}"
        for method in session_pb2.DESCRIPTOR.services_by_name["Sessions"].methods
    }
    assert set(listed.stdout.split()) == expected


def test_the_registry_has_its_own_listener(host: Host, empty_dir: Path) -> None:
    listed = grpcurl(host.registry_address, "list", cwd=empty_dir)
    assert listed.returncode == 0, listed.stderr
    assert {"agentsessions.v1.HarnessRegistry", "grpc.health.v1.Health"} <= set(listed.stdout.split())
    assert "agentsessions.v1.Sessions" not in listed.stdout
    checked = grpcurl(
        "-d",
        '{"service": "agentsessions.v1.HarnessRegistry"}',
        host.registry_address,
        "grpc.health.v1.Health/Check",
        cwd=empty_dir,
    )
    assert json.loads(checked.stdout) == {"status": "SERVING"}


def test_reflection_describes_the_live_sessions_rpcs(host: Host, empty_dir: Path) -> None:
    listed = grpcurl(host.address, "list", "agentsessions.ext.v1.LiveSessions", cwd=empty_dir)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == [
        "agentsessions.ext.v1.LiveSessions.Submit",
        "agentsessions.ext.v1.LiveSessions.Watch",
    ]
    described = grpcurl(host.address, "describe", "agentsessions.ext.v1.WatchUpdate", cwd=empty_dir)
    assert "agentsessions.v1.LogRecord record = 1;" in described.stdout


def test_describe_session_shows_every_field(host: Host, empty_dir: Path) -> None:
    described = grpcurl(host.address, "describe", "agentsessions.v1.Session", cwd=empty_dir)
    assert described.returncode == 0, described.stderr
    assert "message Session {" in described.stdout
    for field in session_pb2.Session.DESCRIPTOR.fields:
        assert re.search(rf"\b{field.name} = {field.number};", described.stdout), field.name


@pytest.mark.parametrize("service", ["", "agentsessions.v1.Sessions", "agentsessions.ext.v1.LiveSessions"])
def test_health_check_is_serving(host: Host, empty_dir: Path, service: str) -> None:
    checked = grpcurl(
        "-d", json.dumps({"service": service}), host.address, "grpc.health.v1.Health/Check", cwd=empty_dir
    )
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout) == {"status": "SERVING"}


def test_health_check_of_an_unknown_service_is_not_found(host: Host, empty_dir: Path) -> None:
    checked = grpcurl(
        "-d", '{"service": "no.such.Service"}', host.address, "grpc.health.v1.Health/Check", cwd=empty_dir
    )
    assert checked.returncode != 0
    assert "Code: NotFound" in checked.stderr


def test_a_bad_request_gets_a_precise_status(host: Host, empty_dir: Path) -> None:
    called = grpcurl("-d", "{}", host.address, "agentsessions.v1.Sessions/GetSession", cwd=empty_dir)
    assert called.returncode != 0
    assert "Code: InvalidArgument" in called.stderr
    assert "uid" in called.stderr


def trailers(verbose_output: str) -> dict[str, str]:
    """The ``Response trailers received:`` block of ``grpcurl -v`` output."""
    block = verbose_output.split("Response trailers received:", 1)[1]
    found: dict[str, str] = {}
    for line in block.splitlines()[1:]:
        key, sep, value = line.partition(": ")
        if not sep:
            break
        found[key] = value
    return found


def test_request_id_round_trip(host: Host, empty_dir: Path) -> None:
    request_id = f"e2e-{os.getpid()}-{free_port()}"
    called = grpcurl(
        "-v",
        "-H",
        f"x-request-id: {request_id}",
        "-d",
        '{"uid": "sess-000000000000000000000000"}',
        host.address,
        "agentsessions.v1.Sessions/GetSession",
        cwd=empty_dir,
    )
    assert "Code: NotFound" in called.stderr
    assert trailers(called.stdout)["x-request-id"] == request_id

    # The access log line is written as the handler unwinds, which may be just after the status
    # left the host: awaited (bounded), never assumed.
    def logged() -> list[dict[str, Any]]:
        return [
            line
            for line in host.json_lines()
            if line.get("request_id") == request_id
            and line["msg"] == "rpc"
            and line["method"] == "/agentsessions.v1.Sessions/GetSession"
        ]

    wait_for_log_line(host, logged)
    [get] = logged()
    assert get["code"] == "NOT_FOUND"
    assert isinstance(get["duration_ms"], float | int)


def test_a_turn_is_logged_without_its_payload(host: Host, empty_dir: Path) -> None:
    secret = f"payload-{os.getpid()}-{free_port()}"
    request = {"inputs": [{"role": "user", "parts": [{"text": {"text": secret}}]}]}
    called = grpcurl(
        "-H",
        "x-request-id: turn-probe",
        "-d",
        json.dumps(request),
        host.address,
        "agentsessions.v1.Sessions/Exec",
        cwd=empty_dir,
    )
    assert called.returncode == 0, called.stderr
    # The turn's records carry the input back to the caller...
    assert secret in called.stdout
    # ...but no log line does (checked once the call's own line is written: lines are written
    # by the host's log thread in batches, awaited here, never assumed).
    wait_for_log_line(
        host,
        lambda: [
            line
            for line in host.json_lines()
            if line.get("request_id") == "turn-probe"
            and line.get("method") == "/agentsessions.v1.Sessions/Exec"
        ],
    )
    assert secret not in host.log_text()


def test_request_id_is_minted_when_absent(host: Host, empty_dir: Path) -> None:
    called = grpcurl("-v", "-d", "{}", host.address, "grpc.health.v1.Health/Check", cwd=empty_dir)
    assert called.returncode == 0, called.stderr
    minted = trailers(called.stdout)["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", minted)
    wait_for_log_line(
        host,
        lambda: [
            line for line in host.json_lines() if line.get("request_id") == minted and line["code"] == "OK"
        ],
    )


def test_unknown_method_is_unimplemented_with_a_request_id(host: Host) -> None:
    with grpc.insecure_channel(host.address) as channel:
        call = channel.unary_unary("/agentsessions.v1.Sessions/NoSuchRpc")
        with pytest.raises(grpc.RpcError) as raised:
            call(b"", timeout=CALL_TIMEOUT, metadata=[("x-request-id", "unknown-method-probe")])
    error: Any = raised.value
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "agentsessions.v1.Sessions/NoSuchRpc" in error.details()
    assert ("x-request-id", "unknown-method-probe") in tuple(error.trailing_metadata())


def test_a_taken_port_stops_startup(host: Host, tmp_path: Path) -> None:
    second = subprocess.run(
        [str(BIN / "agentsessions"), "serve", "--listen", host.address, "--journal", "memory:"],
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT,
        cwd=tmp_path,
    )
    assert second.returncode == 1
    assert f"cannot listen on {host.address}" in second.stderr


@pytest.mark.parametrize(
    ("flag", "named"),
    [
        (["--harness", "mine"], "--harness"),
        (["--harness", "mine=localhost"], "--harness mine"),
        (["--listen", "nowhere"], "--listen"),
        (["--registry-addr", "10.1.2.3:9000"], "--registry-addr"),
        (["--log-format", "xml"], "--log-format"),
    ],
)
def test_bad_configuration_stops_startup(tmp_path: Path, flag: list[str], named: str) -> None:
    refused = subprocess.run(
        [str(BIN / "agentsessions"), "serve", "--journal", "memory:", *flag],
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT,
        cwd=tmp_path,
    )
    assert refused.returncode == 2
    assert named in refused.stderr


class JsonMessages:
    """grpcurl's pretty-printed stream output, one decoded message at a time, each read bounded."""

    def __init__(self, stream: IO[str]) -> None:
        self._messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        buffered = ""
        for line in stream:
            buffered += line
            if line.rstrip() == "}":
                self._messages.put(json.loads(buffered))
                buffered = ""
        self._messages.put(None)

    def next(self) -> dict[str, Any] | None:
        return self._messages.get(timeout=CALL_TIMEOUT)


@pytest.mark.parametrize(
    ("launcher", "signum"),
    [
        ((str(BIN / "agentsessions"), "serve"), signal.SIGTERM),
        ((sys.executable, "-m", "agentsessions.host"), signal.SIGINT),
    ],
    ids=["agentsessions-serve-SIGTERM", "python-m-SIGINT"],
)
def test_signal_drains_to_not_serving_and_exits_zero(
    tmp_path: Path, launcher: tuple[str, ...], signum: signal.Signals
) -> None:
    # The listen address comes from the environment here, proving the AGENTSESSIONS_* path.
    address = f"127.0.0.1:{free_port()}"
    host = start_host(
        tmp_path,
        command=launcher,
        args=["--drain-grace", "30"],
        env={"AGENTSESSIONS_LISTEN": address},
        listen=address,
    )
    try:
        watch = subprocess.Popen(
            [str(GRPCURL), "-plaintext", "-d", "{}", host.address, "grpc.health.v1.Health/Watch"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        assert watch.stdout is not None
        messages = JsonMessages(watch.stdout)
        assert messages.next() == {"status": "SERVING"}

        host.process.send_signal(signum)

        # The drain is observable: the open watch hears NOT_SERVING, then the host ends it cleanly.
        assert messages.next() == {"status": "NOT_SERVING"}
        assert messages.next() is None
        assert watch.wait(timeout=CALL_TIMEOUT) == 0
        assert host.process.wait(timeout=CALL_TIMEOUT) == 0
    finally:
        if host.process.poll() is None:
            host.process.kill()
            host.process.wait(timeout=CALL_TIMEOUT)
    log = host.log_text()
    assert "draining" in log
    assert "stopped" in log


REFLECTION_INFO = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


class OpenReflectionStream:
    """A long-lived call: a reflection stream that stays open until the test ends its requests."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._requests: queue.Queue[reflection_pb2.ServerReflectionRequest | None] = queue.Queue()
        call = channel.stream_stream(
            REFLECTION_INFO,
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        self.responses: Any = call(self._feed(), timeout=CALL_TIMEOUT)

    def _feed(self) -> Iterator[reflection_pb2.ServerReflectionRequest]:
        while (request := self._requests.get(timeout=CALL_TIMEOUT)) is not None:
            yield request

    def list_services(self) -> set[str]:
        self._requests.put(reflection_pb2.ServerReflectionRequest(list_services=""))
        reply = next(self.responses)
        return {service.name for service in reply.list_services_response.service}

    def finish(self) -> None:
        self._requests.put(None)


def wait_for_log_line(host: Host, found: Callable[[], list[dict[str, Any]]]) -> None:
    """Bounded: poll the host's JSON log until ``found`` finds a line."""
    for _ in range(int(CALL_TIMEOUT * 20)):
        if found():
            return
        if host.process.poll() is not None:
            break
        threading.Event().wait(0.05)
    pytest.fail(f"the line never appeared in the host log:\n{host.log_text()}")


def wait_for_log(host: Host, text: str) -> None:
    """Bounded: poll the host's log until ``text`` shows up."""
    for _ in range(int(CALL_TIMEOUT * 20)):
        if text in host.log_text():
            return
        if host.process.poll() is not None:
            break
        threading.Event().wait(0.05)
    pytest.fail(f"{text!r} never appeared in the host log:\n{host.log_text()}")


def test_drain_keeps_serving_an_in_flight_call_until_it_finishes(tmp_path: Path) -> None:
    host = start_host(tmp_path, args=["--drain-grace", "600"])
    try:
        with grpc.insecure_channel(host.address) as channel:
            stream = OpenReflectionStream(channel)
            try:
                assert "agentsessions.v1.Sessions" in stream.list_services()
                host.process.send_signal(signal.SIGTERM)
                wait_for_log(host, "draining")
                # Draining: the open call is still answered...
                assert "grpc.health.v1.Health" in stream.list_services()
            finally:
                stream.finish()
            # ...and ends cleanly when the client ends it, which lets the host exit well inside the grace.
            assert list(stream.responses) == []
        assert host.process.wait(timeout=CALL_TIMEOUT) == 0
    finally:
        if host.process.poll() is None:
            host.process.kill()
            host.process.wait(timeout=CALL_TIMEOUT)


def test_a_second_signal_cuts_the_drain_short(tmp_path: Path) -> None:
    host = start_host(tmp_path, args=["--drain-grace", "600"])
    try:
        with grpc.insecure_channel(host.address) as channel:
            stream = OpenReflectionStream(channel)
            try:
                stream.list_services()
                host.process.send_signal(signal.SIGTERM)
                wait_for_log(host, "draining")
                host.process.send_signal(signal.SIGTERM)
                # Without the cut the host would wait the full 600 s grace for this call.
                assert host.process.wait(timeout=CALL_TIMEOUT) == 0
                with pytest.raises(grpc.RpcError):
                    list(stream.responses)
            finally:
                stream.finish()
        assert "drain cut short" in host.log_text()
    finally:
        if host.process.poll() is None:
            host.process.kill()
            host.process.wait(timeout=CALL_TIMEOUT)
