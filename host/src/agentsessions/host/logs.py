"""Structured host logs: one line per event, as ``key=value`` text or as JSON objects, on stderr.

Structured values travel in ``extra=fields(...)``. Every line written while an RPC is served carries
that RPC's request id (stamped on the record when it is made, by a record factory installed on import).
Payloads never go in a log line: callers pass names, codes and counts only.
"""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import queue
import sys
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


def configure(
    level: str = "info", fmt: str = "text", stream: TextIO | None = None, *, background: bool = False
) -> None:
    """Route the ``agentsessions`` loggers (and grpc's) to one stderr handler in the chosen format.

    With ``background`` (what ``serve`` asks for) a line is formatted where it is logged and
    written by a thread of its own: a write gives up the GIL, and on a loaded host the event loop
    then waits for the journal's threads to hand it back (py-spy put 3-4% of a loaded host's
    event-loop samples in the access log's writes). Every queued line is written before the
    process exits normally (``drain``); lines still queued when the process is killed are lost.
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
    lines: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    queued = logging.handlers.QueueHandler(lines)  # formats the line (prepare), then queues it
    queued.setFormatter(formatter)
    writer = logging.StreamHandler(out.stream)
    writer.setFormatter(logging.Formatter("%(message)s"))
    listener = logging.handlers.QueueListener(lines, writer)
    listener.start()
    _background.append((listener, queued, out))
    root.addHandler(queued)


# The writing thread of a background configuration, its queueing handler and the handler that
# takes over when it stops.
_background: list[tuple[logging.handlers.QueueListener, logging.Handler, logging.Handler]] = []


@atexit.register
def drain() -> None:
    """Write every line still queued, stop the writing thread, and write in place from now on."""
    while _background:
        listener, queued, out = _background.pop()
        root = logging.getLogger()
        if queued in root.handlers:
            root.removeHandler(queued)
            root.addHandler(out)
        listener.stop()


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
