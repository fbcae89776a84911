"""Model providers for durability tests: a counting wrapper, and a real OpenAI-compatible HTTP
endpoint on loopback whose every answer is fresh randomness."""

from __future__ import annotations

import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from agentsessions.host.models.provider import DeltaCallback, ModelError, ModelProvider
from agentsessions.v1 import common_pb2, harness_pb2


class CountingModel:
    """Passes every call to ``inner`` and keeps it, so a test can count what reached the provider."""

    def __init__(self, inner: ModelProvider) -> None:
        self._inner = inner
        self.calls: list[common_pb2.ModelCall] = []

    async def complete(
        self, call: common_pb2.ModelCall, on_delta: DeltaCallback | None = None
    ) -> harness_pb2.ModelResult:
        kept = common_pb2.ModelCall()
        kept.CopyFrom(call)
        self.calls.append(kept)
        return await self._inner.complete(call, on_delta)


class RandomModelServer:
    """``POST <base_url>/chat/completions`` answers random content and random reasoning.

    A replay that reached this server could not reproduce a live output; ``requests`` holds the
    JSON body of every request received. Use as a context manager (serves in a thread).
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                with owner._lock:
                    owner.requests.append(body)
                payload = json.dumps(
                    {
                        "id": "chatcmpl-" + secrets.token_hex(4),
                        "object": "chat.completion",
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {
                                    "role": "assistant",
                                    "content": "random:" + secrets.token_hex(12),
                                    "reasoning_content": "thought:" + secrets.token_hex(6),
                                },
                            }
                        ],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="random-model", daemon=True)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def __enter__(self) -> RandomModelServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)


class FlakyModel:
    """Fails every call while ``down`` is set (as a provider outage), else answers like ``inner``."""

    def __init__(self, inner: ModelProvider) -> None:
        self._inner = inner
        self.down = True
        self.attempts = 0

    async def complete(
        self, call: common_pb2.ModelCall, on_delta: DeltaCallback | None = None
    ) -> harness_pb2.ModelResult:
        self.attempts += 1
        if self.down:
            raise ModelError("provider unavailable (test outage)")
        return await self._inner.complete(call, on_delta)
