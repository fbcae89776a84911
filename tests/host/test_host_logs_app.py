"""Log line formats, and the App's release contract."""

from __future__ import annotations

import contextlib
import contextvars
import io
import json
import logging
from collections.abc import Iterator

import pytest

from agentsessions.host import logs, requestid
from agentsessions.host.app import App, build_app
from agentsessions.host.config import HostConfig
from tests.chaos.scenario import wait_until


def emit(fmt: str, message: str, **values: object) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter() if fmt == "json" else logs.TextFormatter())
    logger = logging.getLogger(f"agentsessions.test.{fmt}")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        logger.warning(message, extra=logs.fields(**values))
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def emit_under(request_id: str, fmt: str, message: str, **values: object) -> str:
    """Emit as an RPC handler would: in its own context, with its request id bound."""

    def handler_body() -> str:
        requestid.bind(request_id)
        return emit(fmt, message, **values)

    return contextvars.copy_context().run(handler_body)


def test_json_lines_carry_fields_and_the_current_request_id() -> None:
    line = emit_under("rid-7", "json", "rpc", method="/a.B/C", code="OK", duration_ms=1.5)
    assert line.count("\n") == 1
    decoded = json.loads(line)
    assert decoded["msg"] == "rpc"
    assert decoded["level"] == "warning"
    assert decoded["logger"] == "agentsessions.test.json"
    assert decoded["ts"].endswith("Z")
    assert (decoded["method"], decoded["code"], decoded["duration_ms"]) == ("/a.B/C", "OK", 1.5)
    assert decoded["request_id"] == "rid-7"


def test_text_lines_quote_values_that_would_split() -> None:
    line = emit(
        "text", "serving", listen="127.0.0.1:1", note='two words "quoted"', names=["a", "b"], empty=""
    )
    assert line.rstrip("\n").split(" ", 3)[1:3] == ["WARNING", "agentsessions.test.text"]
    assert " serving listen=127.0.0.1:1 " in line
    assert 'note="two words \\"quoted\\""' in line
    assert " names=a,b " in line
    assert 'empty=""' in line
    assert "request_id" not in line


async def test_close_runs_every_release_step_last_first_and_reports_failures() -> None:
    order: list[str] = []
    app = App(services=[])

    async def release(name: str, fail: bool = False) -> None:
        order.append(name)
        if fail:
            raise RuntimeError(name)

    app.on_close(lambda: release("store"))
    app.on_close(lambda: release("links", fail=True))
    app.on_close(lambda: release("models"))
    with pytest.raises(RuntimeError, match="links"):
        await app.close()
    assert order == ["models", "links", "store"]
    await app.close()
    assert order == ["models", "links", "store"]


async def test_build_app_serves_sessions_and_keeps_the_registry_for_the_admin_listener() -> None:
    app = await build_app(HostConfig(journal="memory:"))
    try:
        assert [service.name for service in app.services] == [
            "agentsessions.v1.Sessions",
            "agentsessions.ext.v1.LiveSessions",
            "agentsessions.ext.v1.Subagents",
            "agentsessions.ext.v1.SessionCompaction",
        ]
        assert [service.name for service in app.admin_services] == ["agentsessions.v1.HarnessRegistry"]
    finally:
        await app.close()


@contextlib.contextmanager
def _background(stream: io.StringIO, fmt: str) -> Iterator[None]:
    """The host's background logging into ``stream`` for the test; the root logger as it was after."""
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    logs.configure("info", fmt, stream, background=True)
    try:
        yield
    finally:
        logs.drain()
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in before[0]:
            root.addHandler(handler)
        root.setLevel(before[1])


def test_background_logging_writes_every_line_in_order_formatted_where_it_was_logged() -> None:
    stream = io.StringIO()
    with _background(stream, "json"):
        log = logging.getLogger("agentsessions.test.background")
        for i in range(200):
            requestid.bind(f"req-{i}")
            log.info("line", extra=logs.fields(n=i))
        requestid.bind("")
        logs.drain()  # what the process does at exit: every line still gathered is written
        lines = [json.loads(line) for line in stream.getvalue().splitlines()]
        assert [(x["n"], x["request_id"]) for x in lines] == [(i, f"req-{i}") for i in range(200)]
        # After the drain the same handler writes in place: nothing is gathered and lost.
        log.info("after", extra=logs.fields(n=200))
        assert json.loads(stream.getvalue().splitlines()[-1])["n"] == 200


class _CountingStream(io.StringIO):
    """A stream that counts its writes (each one a wake-up of the writing thread and a syscall)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


async def test_background_lines_are_written_in_batches_not_one_wake_up_per_line() -> None:
    stream = _CountingStream()
    with _background(stream, "text"):
        log = logging.getLogger("agentsessions.test.batches")
        for i in range(100):
            log.info("line", extra=logs.fields(n=i))
        await wait_until("the lines to be written", lambda: len(stream.getvalue().splitlines()) == 100)
        # A thread woken for every line wrote 100 times; the batches write once a gathering (20 ms).
        assert stream.writes <= 10
        numbers = [line.rsplit("n=", 1)[1] for line in stream.getvalue().splitlines()]
        assert numbers == [str(i) for i in range(100)]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_line_logged_without_its_record_reads_as_one_logged_with_it(fmt: str) -> None:
    """``logs.log_fields`` (the access log's path) hands the serving process's writer the line's
    parts, which it formats with its batch; the line is the one ``Logger.log`` would have made."""
    values = {"method": "/agentsessions.v1.Sessions/Exec", "code": "OK", "duration_ms": 1.5, "peer": 'a "b"'}
    stream = io.StringIO()
    with _background(stream, fmt):
        log = logging.getLogger("agentsessions.test.fields")
        requestid.bind("req-1")
        log.info("rpc", extra=logs.fields(**values))
        logs.log_fields(log, logging.INFO, "rpc", values)
        requestid.bind("")
        logs.drain()
    with_record, without = stream.getvalue().splitlines()
    # Everything but the timestamps' milliseconds (the two lines were made apart).
    if fmt == "json":
        a, b = json.loads(with_record), json.loads(without)
        assert a.pop("ts")[:19] == b.pop("ts")[:19]
        assert a == b and a["request_id"] == "req-1" and a["peer"] == 'a "b"'
    else:
        assert with_record.split(" ", 1)[1] == without.split(" ", 1)[1]
        assert "request_id=req-1" in without and 'peer="a \\"b\\""' in without


def test_a_line_logged_without_its_record_still_reaches_any_other_handler() -> None:
    """With another handler on the way (a test's capture, an embedding application's handler),
    ``logs.log_fields`` logs the record as usual, so that handler sees it."""
    seen: list[logging.LogRecord] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    stream = io.StringIO()
    capture = Capture()
    with _background(stream, "text"):
        log = logging.getLogger("agentsessions.test.fields.other")
        logging.getLogger().addHandler(capture)
        try:
            logs.log_fields(log, logging.INFO, "rpc", {"code": "OK"})
        finally:
            logging.getLogger().removeHandler(capture)
        logs.drain()
    assert [r.getMessage() for r in seen] == ["rpc"]
    assert stream.getvalue().rstrip().endswith("rpc code=OK")
