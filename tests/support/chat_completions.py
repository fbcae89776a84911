"""A real OpenAI-compatible chat-completions endpoint for crash tests.

A stdlib HTTP server on a loopback port (``scripted_endpoint.ChatEndpoint``), served from a thread
of the test process so it outlives a host that is killed. It counts every request and answers each
with a fresh random token, so a duplicated model call shows up as a token the journal does not
hold. ``hold_next`` makes the next request wait until ``release``: the host is then provably
inside a model call.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tests.support.scripted_endpoint import ChatEndpoint, Reply

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
        self.http = ChatEndpoint(self._answer)
        self.base_url = self.http.base_url

    def _answer(self, body: dict[str, Any]) -> Reply:
        request = self._admit(body)
        if request.held:
            self.held.set()
            self._released.wait(HOLD_LIMIT_S)
        return Reply.completion(request.token)

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


@contextmanager
def chat_completions_server() -> Iterator[ChatCompletionsServer]:
    """Serve a :class:`ChatCompletionsServer` for the duration of the block."""
    server = ChatCompletionsServer()
    with server.http.serving():
        try:
            yield server
        finally:
            server.release()  # a held request is answered before the server shuts down
