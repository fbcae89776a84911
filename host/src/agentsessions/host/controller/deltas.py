"""A model call's streamed text as Delta frames, batched by size and time.

A provider hands over text in whatever pieces it gets (a token, a few characters); one frame each
would cost every client, every interceptor and the stream a message per token, and one session's
long answer would take turns from every other session on the host. So the text is batched: a
frame goes out once ``max_bytes`` of text (UTF-8) are waiting, or ``max_delay_s`` after the first
of them arrived, whichever comes first; a provider chunk bigger than ``max_bytes`` is cut into
frames of that size. Then the final ``done`` frame, with an empty chunk (spec 4.8).

A completion that arrived before any frame was due (the whole answer within the first batch) has
nothing to stream: only the ``done`` frame is sent, and the text reaches the client in the OUTPUT
record that follows it. Deltas are never journaled, so none of this changes the journal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from agentsessions.sdk.structs import struct
from agentsessions.v1 import session_pb2

DeltaSink = Callable[[session_pb2.Delta], Awaitable[None]]

DEFAULT_MAX_BYTES = 1024
DEFAULT_MAX_DELAY_S = 0.2


@struct(frozen=True)
class DeltaBatching:
    """When a batch of streamed text becomes a frame: ``max_bytes`` waiting, or ``max_delay_s``
    after its first piece."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_delay_s: float = DEFAULT_MAX_DELAY_S

    def __post_init__(self) -> None:
        if self.max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {self.max_bytes}")
        if not self.max_delay_s >= 0:
            raise ValueError(f"max_delay_s must be >= 0, got {self.max_delay_s}")


class DeltaStream:
    """The Delta frames of one model call: :meth:`push` each text chunk, then :meth:`finish`."""

    __slots__ = ("_batching", "_emit", "_execution_id", "_flushing", "_parts", "_sent", "_size", "_timer")

    def __init__(self, execution_id: str, emit: DeltaSink, batching: DeltaBatching) -> None:
        self._execution_id = execution_id
        self._emit = emit
        self._batching = batching
        self._parts: list[str] = []
        self._size = 0  # UTF-8 bytes in _parts
        self._sent = False  # a text frame went out
        self._timer: asyncio.TimerHandle | None = None
        self._flushing: asyncio.Task[None] | None = None  # a frame the timer made due

    async def push(self, chunk: str) -> None:
        if not chunk:
            return
        limit = self._batching.max_bytes
        size = len(chunk) if chunk.isascii() else len(chunk.encode())
        if self._size + size < limit:
            self._parts.append(chunk)
            self._size += size
            if self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(self._batching.max_delay_s, self._due)
            return
        for piece, fills in _cut(chunk, limit - self._size, limit):
            self._parts.append(piece)
            self._size += len(piece.encode())
            if fills:
                await self._flush()
        if self._parts and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._batching.max_delay_s, self._due)

    async def finish(self) -> None:
        """The rest of the text (when frames already went out), then the ``done`` frame."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flushing is not None:
            await self._flushing
        if self._sent:
            await self._flush()
        self._parts.clear()
        await self._emit(session_pb2.Delta(execution_id=self._execution_id, done=True))

    def close(self) -> None:
        """Drop what is buffered without sending it (the model call failed)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._parts.clear()

    def _due(self) -> None:
        self._timer = None
        if self._parts:
            self._flushing = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        earlier = self._flushing
        if earlier is not None and earlier is not asyncio.current_task():
            self._flushing = None
            await earlier  # frames leave in the order their text arrived
        if not self._parts:
            return
        text = "".join(self._parts)
        self._parts.clear()
        self._size = 0
        self._sent = True
        await self._emit(session_pb2.Delta(execution_id=self._execution_id, chunk=text))


def _cut(text: str, room: int, limit: int) -> list[tuple[str, bool]]:
    """``text`` in pieces on character boundaries: the first fills ``room`` bytes, the next ones
    ``limit``; each with whether it fills its frame (the last may not). A first piece may be empty
    (the next character does not fit the room); a character wider than ``limit`` goes whole."""
    if text.isascii():
        pieces = [(text[:room], True)]
        pieces += [(text[i : i + limit], True) for i in range(room, len(text), limit)]
        last, _ = pieces[-1]
        full = len(last) == (room if len(pieces) == 1 else limit)
        pieces[-1] = (last, full)
        return [(piece, fills) for piece, fills in pieces if piece]
    out: list[tuple[str, bool]] = []
    piece: list[str] = []
    size, budget = 0, room
    for char in text:
        width = len(char.encode())
        if size + width > budget and (piece or budget < limit):
            out.append(("".join(piece), True))
            piece, size, budget = [], 0, limit
        piece.append(char)
        size += width
    if piece:
        out.append(("".join(piece), size >= budget))
    return out
