"""Structured host logs: one line per event, as ``key=value`` text or as JSON objects, on stderr.

Structured values travel in ``extra=fields(...)``. Every line written while an RPC is served carries
that RPC's request id (stamped on the record when it is made, by a record factory installed on import).
Payloads never go in a log line: callers pass names, codes and counts only.
"""

from __future__ import annotations

import atexit
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

from agentsessions.host import requestid

_FIELDS = "agentsessions_fields"
_REQUEST_ID = "agentsessions_request_id"


def _stamp_request_id(factory: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    """Wrap the record factory so each record keeps the request id current when it was made."""

    def make(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        setattr(record, _REQUEST_ID, requestid.current())
        return record

    setattr(make, _REQUEST_ID, True)
    return make


# Installed on import, once, so records made under any handler (test capture included) carry the id.
if not getattr(logging.getLogRecordFactory(), _REQUEST_ID, False):
    logging.setLogRecordFactory(_stamp_request_id(logging.getLogRecordFactory()))


def fields(**values: Any) -> dict[str, Any]:
    """``extra=`` for a log call: ``log.info("rpc", extra=fields(method=m, code="OK"))``."""
    return {_FIELDS: values}


# How long the background writer lets lines gather after the first one before writing them all.
LINGER_S = 0.02


def configure(
    level: str = "info", fmt: str = "text", stream: TextIO | None = None, *, background: bool = False
) -> None:
    """Route the ``agentsessions`` loggers (and grpc's) to one stderr handler in the chosen format.

    With ``background`` (what ``serve`` asks for) a line is formatted where it is logged and
    written by a thread of its own (``_Batches``): a write gives up the GIL, and on a loaded host the
    event loop then waits for the journal's threads to hand it back (py-spy put 3-4% of a loaded
    host's event-loop samples in the access log's writes). Every line still to write is written
    before the process exits normally (``drain``); lines not yet written when the process is killed
    (at most ``LINGER_S`` of them) are lost.
    """
    drain()
    formatter: logging.Formatter = JsonFormatter() if fmt == "json" else TextFormatter()
    out = logging.StreamHandler(stream or sys.stderr)
    out.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.setLevel(level.upper())
    if not background:
        root.addHandler(out)
        return
    batches = _Batches(out.stream, formatter)
    _background.append((batches, out))
    root.addHandler(batches)


class _Batches(logging.Handler):
    """Formats each record where it is logged and leaves the line to a writing thread, which wakes
    once for the first line of a batch, lets more gather for ``LINGER_S`` and writes them in one
    go. A thread woken for every line (a queue and its listener) cost a host ~0.15 ms of CPU per
    RPC in wake-ups and GIL hand-offs (bench/README.md, "What one RPC costs the host")."""

    def __init__(self, stream: TextIO, formatter: logging.Formatter) -> None:
        super().__init__()
        self.setFormatter(formatter)
        self._stream = stream
        self._lines: list[str] = []  # guarded by the handler's own lock, which handle() holds in emit
        self._wake = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._write, name="agentsessions-log-writer", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        first = not self._lines
        self._lines.append(line)
        if first:
            self._wake.set()

    def _write(self) -> None:
        while True:
            self._wake.wait()
            if not self._closing:
                time.sleep(LINGER_S)  # the lines logged meanwhile go with this one
            with self.lock:  # type: ignore[union-attr]  # made by Handler.__init__
                lines, self._lines = self._lines, []
                self._wake.clear()
                closing = self._closing
            if lines:
                try:
                    self._stream.write("\n".join(lines) + "\n")
                    self._stream.flush()
                except (OSError, ValueError):
                    pass  # stderr gone (closed pipe): the lines cannot go anywhere
            if closing:
                return

    def close(self) -> None:
        """Write what is still gathered and stop the thread."""
        with self.lock:  # type: ignore[union-attr]
            self._closing = True
        self._wake.set()
        self._thread.join()
        super().close()


# The batching handler of a background configuration and the handler that takes over once it stops.
_background: list[tuple[_Batches, logging.Handler]] = []


@atexit.register
def drain() -> None:
    """Write every line still gathered, stop the writing thread, and write in place from now on."""
    while _background:
        batches, out = _background.pop()
        root = logging.getLogger()
        if batches in root.handlers:
            root.removeHandler(batches)
            root.addHandler(out)
        batches.close()


def _timestamp(record: logging.LogRecord) -> str:
    """``2024-05-01T12:00:00.123Z``; the part up to the second is formatted once a second."""
    global _second_text, _second
    second = int(record.created)
    if second != _second:
        _second_text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second = second
    millis = int((record.created - second) * 1000)
    return f"{_second_text}.{millis:03d}Z"


_second = -1
_second_text = ""


def _structured(record: logging.LogRecord) -> dict[str, Any]:
    values: dict[str, Any] = {}
    request_id = getattr(record, _REQUEST_ID, "")
    extra = getattr(record, _FIELDS, None)
    if isinstance(extra, dict):
        values.update(extra)
    if request_id and "request_id" not in values:
        values["request_id"] = request_id
    return values


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        line.update(_structured(record))
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``<ts> <LEVEL> <logger> <msg> key=value ...``; values with spaces or quotes are quoted."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [_timestamp(record), record.levelname, record.name, record.getMessage()]
        parts.extend(f"{key}={_text_value(value)}" for key, value in _structured(record).items())
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _text_value(value: Any) -> str:
    if isinstance(value, list | tuple):
        value = ",".join(str(item) for item in value)
    text = str(value)
    if not text or any(c in text for c in ' "=\n\t'):
        return json.dumps(text)
    return text
