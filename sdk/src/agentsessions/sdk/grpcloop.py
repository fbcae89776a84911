"""An asyncio event loop that takes grpc.aio's completions in batches.

grpc.aio learns of gRPC core's completions (a message read or written, a call ended) on a poller
thread of its own, which queues each one and writes one byte to a socket pair; the event loop
watches the other end and runs grpc's handler, which reads **one** byte and then runs every
completion queued. A busy process gets its completions in bursts, so the handler that ran them all
is followed by one call per byte still unread, each a pass of the loop, a ``recv`` system call
and a look at an empty queue. On the host at 32 sessions 2-19 bytes were waiting at two of the
handler's calls in three, 20 or more at a quarter (bench/NOTEBOOK.md, "grpc.aio's completions in one
pass").

:class:`GrpcEventLoop` wraps that one handler when grpc registers it: before it runs, the bytes
waiting beyond one are read in one ``recv`` (their completions are queued already: the poller
queues a completion before it writes its byte), so the handler's own read takes the last byte and
its pass runs them all. Completions queued while it runs write bytes of their own and wake the
loop again, as before. Any other reader is left as it is, and so is grpc's when its handler is not
the one described here (another grpcio may register another; ``tests/sdk/test_grpcloop.py`` says
so for the installed one).
"""

from __future__ import annotations

import array
import asyncio
import functools
import socket
from collections.abc import Callable
from typing import Any, TypeVarTuple

try:
    import fcntl
    import termios
except ImportError:  # pragma: no cover - not on POSIX: no batching
    fcntl = None  # type: ignore[assignment]
    termios = None  # type: ignore[assignment]

_Ts = TypeVarTuple("_Ts")

# The grpc.aio handler this batches: a method of this name on a class of this name.
GRPC_HANDLER = "_handle_events"
GRPC_POLLER = "PollerCompletionQueue"


def is_grpc_poller(fd: object, callback: Callable[..., object]) -> bool:
    """Whether ``add_reader(fd, callback)`` is grpc.aio registering its poller's socket."""
    if fcntl is None or not isinstance(fd, socket.socket):
        return False
    func = callback.func if isinstance(callback, functools.partial) else callback
    owner = getattr(func, "__self__", None)
    return getattr(func, "__name__", "") == GRPC_HANDLER and type(owner).__name__ == GRPC_POLLER


class BatchedWakeups:
    """grpc.aio's handler, run after the bytes waiting beyond one are read."""

    __slots__ = ("_buffer", "_callback", "_fileno", "_socket")

    def __init__(self, sock: socket.socket, callback: Callable[..., object]) -> None:
        self._socket = sock
        self._fileno = sock.fileno()
        self._callback = callback
        self._buffer = array.array("i", [0])

    def __call__(self) -> None:
        try:
            fcntl.ioctl(self._fileno, termios.FIONREAD, self._buffer, True)
            waiting = self._buffer[0]
            if waiting > 1:
                # Readable with `waiting` bytes: this returns at once, and only this thread reads.
                self._socket.recv(waiting - 1)
        except OSError:
            pass  # the handler reads as it always did
        self._callback()


class GrpcEventLoop(asyncio.SelectorEventLoop):
    """A selector event loop that runs grpc.aio's queued completions in one pass per wake-up."""

    def add_reader(self, fd: Any, callback: Callable[[*_Ts], Any], *args: *_Ts) -> None:
        if not args and is_grpc_poller(fd, callback):
            super().add_reader(fd, BatchedWakeups(fd, callback))
            return
        super().add_reader(fd, callback, *args)


def new_loop() -> asyncio.AbstractEventLoop:
    """A :class:`GrpcEventLoop` (``asyncio.Runner(loop_factory=new_loop)``)."""
    return GrpcEventLoop()
