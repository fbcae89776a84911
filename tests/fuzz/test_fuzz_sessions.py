"""Every Sessions RPC fuzzed over the wire against a real host process.

Each RPC gets request bytes drawn by ``tests.fuzz.strategies.wire``: well-formed messages with
extreme values (int64 bounds, unknown enums, NaN in Struct values, deep nesting, real and bogus
uids), and broken ones (invalid UTF-8, truncated, corrupt, random bytes). Whatever a client sends,
the host answers a documented status: never UNKNOWN, INTERNAL or DATA_LOSS, and it writes no
traceback to its log for a bad request. The host keeps serving after every case.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import pytest
from google.protobuf import descriptor as d
from hypothesis import HealthCheck, given, settings

from agentsessions.v1 import common_pb2, session_pb2
from tests.fuzz.strategies import wire
from tests.support.host_process import BIN, repo_env

pytestmark = pytest.mark.e2e

FORBIDDEN = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS})
CALL_TIMEOUT_S = 20.0
START_TIMEOUT_S = 60.0
EXAMPLES = 120
SESSIONS = session_pb2.DESCRIPTOR.services_by_name["Sessions"]
NAMES_A_FIELD = re.compile(
    r"[A-Za-z_][\w.]*(\[[^\]]*\])*(\.[\w<> ]+(\[[^\]]*\])*)*(\.\.\.\(\d+ more fields\))?: \S"
)


@dataclass
class Host:
    address: str
    channel: grpc.Channel
    log: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)

    def tracebacks(self, since: int) -> list[str]:
        return [line for line in self.log[since:] if "Traceback" in line or '"exc_info"' in line]


def _pump(stream: object, into: list[str], serving: threading.Event, address: list[str]) -> None:
    for raw in stream:  # type: ignore[attr-defined]
        line = raw.decode(errors="replace")
        into.append(line)
        if not serving.is_set() and line.startswith("{"):
            entry = json.loads(line)
            if entry.get("msg") == "serving":
                address.append(str(entry["listen"]))
                serving.set()


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    folder = tmp_path_factory.mktemp("fuzz-host")
    proc = subprocess.Popen(
        [
            str(BIN / "agentsessions"),
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--journal",
            str(folder / "journal.db"),
            "--log-format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=repo_env(),
        cwd=folder,
    )
    log: list[str] = []
    serving = threading.Event()
    address: list[str] = []
    pump = threading.Thread(target=_pump, args=(proc.stdout, log, serving, address), daemon=True)
    pump.start()
    try:
        assert serving.wait(START_TIMEOUT_S), "host did not serve:\n" + "".join(log)
        channel = grpc.insecure_channel(address[0])
        found = Host(address[0], channel, log)
        found.known.extend(_seed(channel))
        yield found
        channel.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _seed(channel: grpc.Channel) -> list[str]:
    """Two sessions with a finished turn each: their uids and execution ids go into the draws."""
    create = channel.unary_unary(
        "/agentsessions.v1.Sessions/CreateSession",
        request_serializer=session_pb2.CreateSessionRequest.SerializeToString,
        response_deserializer=session_pb2.Session.FromString,
    )
    run = channel.unary_stream(
        "/agentsessions.v1.Sessions/Exec",
        request_serializer=session_pb2.ExecRequest.SerializeToString,
        response_deserializer=session_pb2.ExecUpdate.FromString,
    )
    known: list[str] = []
    for _ in range(2):
        uid = create(session_pb2.CreateSessionRequest(), timeout=CALL_TIMEOUT_S).metadata.uid
        text = common_pb2.Message(role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text="seed"))])
        for update in run(session_pb2.ExecRequest(session=uid, inputs=[text]), timeout=CALL_TIMEOUT_S):
            if update.WhichOneof("update") == "record" and update.record.event.execution_id:
                known.append(update.record.event.execution_id)
        known.append(uid)
    return sorted(set(known))


def _call(host: Host, method: d.MethodDescriptor, request: bytes) -> grpc.StatusCode:
    return _answer(host, method, request)[0]


def _answer(host: Host, method: d.MethodDescriptor, request: bytes) -> tuple[grpc.StatusCode, str]:
    path = f"/{SESSIONS.full_name}/{method.name}"
    try:
        if method.server_streaming:
            for _ in host.channel.unary_stream(path)(request, timeout=CALL_TIMEOUT_S):
                pass
        else:
            host.channel.unary_unary(path)(request, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


@pytest.mark.parametrize("method", list(SESSIONS.methods), ids=lambda m: m.name)
def test_no_request_gets_an_undocumented_status(host: Host, method: d.MethodDescriptor) -> None:
    before = len(host.log)
    seen: dict[str, bytes] = {}

    @settings(
        max_examples=EXAMPLES,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(request=wire(method.input_type, host.known))
    def case(request: bytes) -> None:
        code, details = _answer(host, method, request)
        if code in FORBIDDEN:
            seen.setdefault(code.name, request)
        assert code not in FORBIDDEN, f"{method.name} answered {code.name} for {request!r}"
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            # "<field>: <rule>" (docs/errors.md): the message names what to fix.
            assert NAMES_A_FIELD.match(details), f"{method.name}: {details!r} names no field"

    case()
    assert not host.tracebacks(before), f"{method.name}: the host logged tracebacks:\n" + "".join(
        host.tracebacks(before)[:3]
    )
    # Still serving, and still answering real work.
    assert _call(
        host,
        SESSIONS.methods_by_name["GetSession"],
        session_pb2.GetSessionRequest(uid=host.known[-1]).SerializeToString(),
    ) in (
        grpc.StatusCode.OK,
        grpc.StatusCode.NOT_FOUND,  # a fuzzed DeleteSession may have removed it
    )
