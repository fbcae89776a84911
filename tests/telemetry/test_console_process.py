"""``agentsessions serve --otel-exporter console`` as a real process: a turn's spans reach stdout,
named for the service, and the exit flushes them; the turn's text does not appear in any span."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from agentsessions.sdk.harness import text_message
from agentsessions.v1 import session_pb2, session_pb2_grpc
from tests.e2e.test_serve import CALL_TIMEOUT, start_host

pytestmark = pytest.mark.e2e

SECRET = "console-payload-5c2b"


def spans_in(text: str) -> list[dict[str, object]]:
    """The console exporter's span objects (pretty-printed JSON, one after another)."""
    decoder = json.JSONDecoder()
    found: list[dict[str, object]] = []
    index = text.find("{")
    while index != -1:
        try:
            value, end = decoder.raw_decode(text, index)
        except json.JSONDecodeError:
            index = text.find("{", index + 1)
            continue
        if isinstance(value, dict) and "context" in value and "name" in value:
            found.append(value)
        index = text.find("{", end)
    return found


def test_console_exporter_prints_the_turn_spans_at_exit(tmp_path: Path) -> None:
    host = start_host(tmp_path, args=["--otel-exporter", "console"])
    try:
        with grpc.insecure_channel(host.address) as channel:
            stub = session_pb2_grpc.SessionsStub(channel)
            session = stub.CreateSession(session_pb2.CreateSessionRequest(), timeout=CALL_TIMEOUT)
            request = session_pb2.ExecRequest(
                session=session.metadata.uid, inputs=[text_message("user", SECRET)]
            )
            updates = list(stub.Exec(request, timeout=CALL_TIMEOUT))
        assert updates[-1].record.event.end.state == "COMPLETED"
    finally:
        assert host.stop() == 0
    text = host.log_text()
    spans = spans_in(text)
    names = {span["name"] for span in spans}
    assert {"agentsessions.v1.Sessions/Exec", "invoke_agent echo", "chat echo", "journal.append"} <= names
    for span in spans:
        resource = span["resource"]
        assert isinstance(resource, dict)
        attributes = resource["attributes"]
        assert isinstance(attributes, dict) and attributes["service.name"] == "agentsessions-host"
        assert SECRET not in json.dumps(span)
