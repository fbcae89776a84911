"""A chat-completions endpoint on loopback that answers from a script: statuses, headers, dropped
connections, completions (plain JSON or server-sent events, as each request asks).

Every request is recorded with its JSON body and the monotonic time it arrived, so a test can count
what reached the provider and check the waits between retries. A request beyond the script gets
``418 script exhausted``, which no test expects.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    """One scripted answer. ``text`` set: a completion; ``drop``: close without answering."""

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    text: str | None = None
    error: str = ""
    drop: bool = False
    usage: Mapping[str, int] | None = None
    tool_calls: Sequence[Mapping[str, Any]] = ()

    @classmethod
    def completion(
        cls,
        text: str,
        *,
        usage: Mapping[str, int] | None = None,
        tool_calls: Sequence[Mapping[str, Any]] = (),
    ) -> Reply:
        return cls(text=text, usage=usage, tool_calls=tool_calls)

    @classmethod
    def failure(cls, status: int, error: str = "", **headers: str) -> Reply:
        return cls(status=status, error=error, headers={k.replace("_", "-"): v for k, v in headers.items()})


@dataclass(frozen=True)
class Received:
    body: dict[str, Any]
    at: float  # time.monotonic() on arrival


class ChatEndpoint:
    """The loopback HTTP server: each POST's JSON body goes to ``answer`` (on the server's thread,
    which may block), and the :class:`Reply` it returns is sent as the request asked (plain JSON
    or server-sent events)."""

    def __init__(self, answer: Callable[[dict[str, Any]], Reply]) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                reply = answer(body)
                if reply.drop:
                    self.close_connection = True
                    return
                payload, content_type = _payload(reply, stream=bool(body.get("stream")))
                # A caller that went away (a killed host) leaves its answer undelivered.
                with contextlib.suppress(OSError):
                    self.send_response(reply.status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                    self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @contextmanager
    def serving(self) -> Iterator[None]:
        """Serve from a thread of this process for the duration of the block."""
        thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        thread.start()
        try:
            yield
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(timeout=10)


class ScriptedEndpoint:
    def __init__(self, replies: Sequence[Reply] = ()) -> None:
        self._lock = threading.Lock()
        self._script = list(replies)
        self._received: list[Received] = []
        self.http = ChatEndpoint(self._next)
        self.base_url = self.http.base_url

    def _next(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self._received.append(Received(body, time.monotonic()))
            if not self._script:
                return Reply.failure(418, "script exhausted")
            return self._script.pop(0)

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)


def _payload(reply: Reply, *, stream: bool) -> tuple[bytes, str]:
    if reply.text is None:
        error = {"error": {"message": reply.error or f"status {reply.status}", "type": "scripted"}}
        return json.dumps(error).encode(), "application/json"
    calls = [
        {
            "id": c["id"],
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["args"])},
        }
        for c in reply.tool_calls
    ]
    if not stream:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text}
        if calls:
            message["tool_calls"] = calls
        answer: dict[str, Any] = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
        if reply.usage is not None:
            answer["usage"] = dict(reply.usage)
        return json.dumps(answer).encode(), "application/json"
    delta: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if calls:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
    events: list[dict[str, Any]] = [{"choices": [{"index": 0, "delta": delta}]}]
    if reply.usage is not None:
        events.append({"choices": [], "usage": dict(reply.usage)})
    lines = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return lines + b"data: [DONE]\n\n", "text/event-stream"


@contextmanager
def scripted_endpoint(*replies: Reply) -> Iterator[ScriptedEndpoint]:
    """Serve a :class:`ScriptedEndpoint` from a thread for the duration of the block."""
    endpoint = ScriptedEndpoint(replies)
    with endpoint.http.serving():
        yield endpoint
