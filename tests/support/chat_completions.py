"""A real OpenAI-compatible chat-completions endpoint for crash tests.

A stdlib HTTP server on a loopback port, served from a thread of the test process so it outlives
a host that is killed. It counts every request and answers each with a fresh random token, so a
duplicated model call shows up as a token the journal does not hold. ``hold_next`` makes the next
request wait until ``release``: the host is then provably inside a model call.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# How long a held request waits for release before it is answered anyway (a bound, not a timing).
HOLD_LIMIT_S = 60.0


@dataclass(frozen=True)
class ModelRequest:
    """One request the endpoint received and the token it issued for it (delivered or not)."""

    body: dict[str, Any]
    token: str
    held: bool


class ChatCompletionsServer:
    """Counts requests, issues random completions, and can hold one request open."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: list[ModelRequest] = []
        self._hold_armed = False
        self._released = threading.Event()
        self.held = threading.Event()  # set once a held request has arrived
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                request = endpoint._admit(body)
                if request.held:
                    endpoint.held.set()
                    endpoint._released.wait(HOLD_LIMIT_S)
                # A killed host is gone by the time a held request is answered: its token stays undelivered.
                with contextlib.suppress(OSError):
                    self._answer(body, request.token)

            def _answer(self, body: dict[str, Any], token: str) -> None:
                if body.get("stream"):
                    delta = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": token}}]}
                    payload = b"data: " + json.dumps(delta).encode() + b"\n\ndata: [DONE]\n\n"
                    content_type = "text/event-stream"
                else:
                    message = {"role": "assistant", "content": token}
                    reply = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
                    payload = json.dumps(reply).encode()
                    content_type = "application/json"
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def _admit(self, body: dict[str, Any]) -> ModelRequest:
        with self._lock:
            held = self._hold_armed
            self._hold_armed = False
            request = ModelRequest(body, "tok-" + secrets.token_hex(8), held)
            self._requests.append(request)
            return request

    def hold_next(self) -> None:
        """The next request waits until :meth:`release` (at most ``HOLD_LIMIT_S``)."""
        with self._lock:
            self._hold_armed = True
            self._released.clear()
            self.held.clear()

    def release(self) -> None:
        self._released.set()

    @property
    def requests(self) -> list[ModelRequest]:
        with self._lock:
            return list(self._requests)

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        thread.start()
        return thread

    def close(self, thread: threading.Thread) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
        thread.join(timeout=10)


@contextmanager
def chat_completions_server() -> Iterator[ChatCompletionsServer]:
    """Serve a :class:`ChatCompletionsServer` for the duration of the block."""
    server = ChatCompletionsServer()
    thread = server.serve_in_thread()
    try:
        yield server
    finally:
        server.close(thread)
