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


def log_fields(logger: logging.Logger, level: int, msg: str, values: dict[str, Any]) -> None:
    """``logger.log(level, msg, extra=fields(**values))``, for a caller that checked the level.

    Where the line would reach the serving process's batching writer and nothing else (no other
    handler, no filter on its way), it goes there as parts, without a LogRecord, and the writer
    formats it with its batch: on a host that serves a call now and then, building the record and
    formatting the line cost the loop ~0.1 ms a call, most of it in caches gone cold since the
    last call (bench/NOTEBOOK.md, "What one RPC costs the host"). The line reads the same."""
    batches = _sole_writer(logger, level)
    if batches is None:
        logger.log(level, msg, extra=fields(**values))
        return
    request_id = requestid.current()
    if request_id and "request_id" not in values:
        values = {**values, "request_id": request_id}
    batches.add((time.time(), logging.getLevelName(level), logger.name, msg, values))


def _sole_writer(logger: logging.Logger, level: int) -> _Batches | None:
    """The batching writer that alone would see ``logger``'s line at ``level``; None otherwise."""
    if not _background:
        return None
    batches = _background[-1][0]
    node: logging.Logger | None = logger
    while node is not None:
        if node.filters or node.disabled:
            return None
        if node.handlers:
            if node.handlers != [batches] or node.parent is not None:
                return None  # another handler, or handlers short of the root
            return batches if not batches.filters and level >= batches.level else None
        if not node.propagate:
            return None
        node = node.parent
    return None


# How long the background writer lets lines gather after the first one before writing them all.
LINGER_S = 0.02


def configure(
    level: str = "info", fmt: str = "text", stream: TextIO | None = None, *, background: bool = False
) -> None:
    """Route the ``agentsessions`` loggers (and grpc's) to one stderr handler in the chosen format.

    With ``background`` (what ``serve`` asks for) a line is formatted where it is logged (one
    logged with :func:`log_fields` by the writing thread, from its parts) and written by a thread
    of its own (``_Batches``): a write gives up the GIL, and on a loaded host the event loop then
    waits for the journal's threads to hand it back (py-spy put 3-4% of a loaded host's event-loop
    samples in the access log's writes). Every line still to write is written
    before the process exits normally (``drain``); lines not yet written when the process is killed
    (at most ``LINGER_S`` of them) are lost.
    """
    drain()
    formatter: _FieldsFormatter = JsonFormatter() if fmt == "json" else TextFormatter()
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
    RPC in wake-ups and GIL hand-offs (bench/NOTEBOOK.md, "What one RPC costs the host").

    :meth:`add` takes a line's parts without a LogRecord (see :func:`log_fields`); the writing thread
    formats those with the batch, where formatting thirty lines costs what one costs on a loop
    that comes back to it cold between calls."""

    def __init__(self, stream: TextIO, formatter: _FieldsFormatter) -> None:
        super().__init__()
        self._formatter = formatter  # records and parts alike: one line format
        self._stream = stream
        # Lines, or the parts of lines still to format; guarded by the handler's own lock, which
        # handle() holds around emit.
        self._lines: list[str | _Parts] = []
        self._wake = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._write, name="agentsessions-log-writer", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self._formatter.format(record)
        except Exception:
            self.handleError(record)
            return
        self._gather(line)  # handle() holds the lock around emit

    def add(self, parts: _Parts) -> None:
        """A line's parts, to be formatted and written with the batch."""
        with self.lock:  # type: ignore[union-attr]  # made by Handler.__init__
            self._gather(parts)

    def _gather(self, line: str | _Parts) -> None:
        """Add ``line`` to the batch (the lock held), waking the writer for a batch's first."""
        if not self._lines:
            self._wake.set()
        self._lines.append(line)

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
                text = [line if isinstance(line, str) else self._formatted(line) for line in lines]
                try:
                    self._stream.write("\n".join(text) + "\n")
                    self._stream.flush()
                except (OSError, ValueError):
                    pass  # stderr gone (closed pipe): the lines cannot go anywhere
            if closing:
                return

    def _formatted(self, parts: _Parts) -> str:
        try:
            return self._formatter.line(*parts)
        except Exception:  # the writing thread must outlive any line
            return f"{_timestamp(parts[0])} ERROR agentsessions.host.logs unformattable line from {parts[2]}"

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


def _timestamp(created: float) -> str:
    """``2024-05-01T12:00:00.123Z``; the part up to the second is formatted once a second. Called
    on the event loop and on the writing thread: the second and its text change together."""
    global _second
    second = int(created)
    cached, text = _second
    if second != cached:
        text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second = (second, text)
    millis = int((created - second) * 1000)
    return f"{text}.{millis:03d}Z"


_second: tuple[int, str] = (-1, "")


def _structured(record: logging.LogRecord) -> dict[str, Any]:
    values: dict[str, Any] = {}
    request_id = getattr(record, _REQUEST_ID, "")
    extra = getattr(record, _FIELDS, None)
    if isinstance(extra, dict):
        values.update(extra)
    if request_id and "request_id" not in values:
        values["request_id"] = request_id
    return values


# A line without its LogRecord: created (time.time()), level name, logger name, message, fields.
_Parts = tuple[float, str, str, str, dict[str, Any]]


class _FieldsFormatter(logging.Formatter):
    """A formatter whose line is a function of the record's parts alone (:meth:`line`), so a line
    logged without a LogRecord (:func:`log_fields`) reads exactly as one logged with it."""

    def line(
        self, created: float, level: str, logger: str, msg: str, values: dict[str, Any], exc: str = ""
    ) -> str:
        raise NotImplementedError

    def format(self, record: logging.LogRecord) -> str:
        exc = self.formatException(record.exc_info) if record.exc_info else ""
        return self.line(
            record.created, record.levelname, record.name, record.getMessage(), _structured(record), exc
        )


class JsonFormatter(_FieldsFormatter):
    """One JSON object per line: ts, level, logger, msg, then the structured fields."""

    def line(
        self, created: float, level: str, logger: str, msg: str, values: dict[str, Any], exc: str = ""
    ) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(created),
            "level": level.lower(),
            "logger": logger,
            "msg": msg,
        }
        line.update(values)
        if exc:
            line["exc"] = exc
        return json.dumps(line, default=str, separators=(",", ":"))


class TextFormatter(_FieldsFormatter):
    """``<ts> <LEVEL> <logger> <msg> key=value ...``; values with spaces or quotes are quoted."""

    def line(
        self, created: float, level: str, logger: str, msg: str, values: dict[str, Any], exc: str = ""
    ) -> str:
        parts = [_timestamp(created), level, logger, msg]
        parts.extend(f"{key}={_text_value(value)}" for key, value in values.items())
        line = " ".join(parts)
        return line + "\n" + exc if exc else line


def _text_value(value: Any) -> str:
    if isinstance(value, list | tuple):
        value = ",".join(str(item) for item in value)
    text = str(value)
    if not text or any(c in text for c in ' "=\n\t'):
        return json.dumps(text)
    return text
