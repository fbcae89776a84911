"""grpc.aio's completions in one pass per wake-up (``agentsessions.sdk.grpcloop``).

A stand-in for grpc.aio's poller (a class of the same name whose ``_handle_events`` reads one byte
and runs every queued completion, the poller writing one byte per completion) shows what the loop
changes: a burst of completions is one handler call, not one per byte. A real grpc.aio server and
client then show that the installed grpcio registers the handler this loop recognizes.
"""

from __future__ import annotations

import array
import asyncio
import collections
import fcntl
import functools
import socket
import termios
from collections.abc import Iterator

import grpc
import pytest

from agentsessions.host import eventloop
from agentsessions.sdk.grpcloop import BatchedWakeups, GrpcEventLoop, is_grpc_poller, new_loop


class PollerCompletionQueue:
    """grpc.aio's poller as far as the loop sees it (the same class and method names)."""

    def __init__(self) -> None:
        self.reader, self.writer = socket.socketpair()
        self.queue: collections.deque[int] = collections.deque()
        self.done: list[int] = []
        self.calls = 0

    def complete(self, *events: int) -> None:
        """The poller thread's side: queue each completion, then write its byte."""
        for event in events:
            self.queue.append(event)
            self.writer.send(b"1")

    def _handle_events(self, loop: asyncio.AbstractEventLoop) -> None:
        self.calls += 1
        self.reader.recv(1)
        while self.queue:
            self.done.append(self.queue.popleft())

    def close(self) -> None:
        self.reader.close()
        self.writer.close()


def _waiting(sock: socket.socket) -> int:
    buffer = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, buffer, True)
    return buffer[0]


@pytest.fixture
def poller() -> Iterator[PollerCompletionQueue]:
    queue = PollerCompletionQueue()
    yield queue
    queue.close()


async def _burst(poller: PollerCompletionQueue) -> None:
    loop = asyncio.get_running_loop()
    loop.add_reader(poller.reader, functools.partial(poller._handle_events, loop))
    try:
        poller.complete(1, 2, 3, 4, 5)
        # Every byte is written before the loop looks: each pass below sees what is left of them.
        for _ in range(10):
            await asyncio.sleep(0)
    finally:
        loop.remove_reader(poller.reader)


def _run(factory: type[asyncio.AbstractEventLoop], poller: PollerCompletionQueue) -> None:
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_burst(poller))


def test_a_burst_of_completions_is_one_handler_call(poller: PollerCompletionQueue) -> None:
    _run(GrpcEventLoop, poller)
    assert poller.done == [1, 2, 3, 4, 5]
    assert poller.calls == 1
    assert _waiting(poller.reader) == 0


def test_asyncios_own_loop_calls_the_handler_once_a_byte(poller: PollerCompletionQueue) -> None:
    # The control: the same burst on asyncio's selector loop.
    _run(asyncio.SelectorEventLoop, poller)
    assert poller.done == [1, 2, 3, 4, 5]
    assert poller.calls == 5


def test_the_hosts_loop_batches_too(poller: PollerCompletionQueue) -> None:
    _run(eventloop.AcceptFirstLoop, poller)
    assert (poller.calls, poller.done) == (1, [1, 2, 3, 4, 5])


def test_only_grpcs_poller_is_recognized(poller: PollerCompletionQueue) -> None:
    loop = asyncio.new_event_loop()
    try:
        handler = functools.partial(poller._handle_events, loop)
        assert is_grpc_poller(poller.reader, handler)
        assert is_grpc_poller(poller.reader, poller._handle_events)
        assert not is_grpc_poller(poller.reader.fileno(), handler)  # not a socket object
        assert not is_grpc_poller(poller.reader, print)
    finally:
        loop.close()


def test_other_readers_are_left_as_they_are(poller: PollerCompletionQueue) -> None:
    loop = GrpcEventLoop()
    try:
        seen: list[bytes] = []

        def on_readable() -> None:
            seen.append(poller.reader.recv(16))

        loop.add_reader(poller.reader, on_readable)
        key = loop._selector.get_key(poller.reader)  # type: ignore[attr-defined]
        assert key.data[0]._callback is on_readable
        loop.remove_reader(poller.reader)
    finally:
        loop.close()


def _grpc_reader(loop: asyncio.AbstractEventLoop) -> list[object]:
    selector = loop._selector  # type: ignore[attr-defined]
    return [key.data[0]._callback for key in selector.get_map().values() if key.data[0] is not None]


async def _echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return request


async def _calls() -> list[object]:
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(_echo)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Echo", {"Call": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/t.Echo/Call")

            async def caller(n: int) -> list[bytes]:
                return [await call(f"{n}-{i}".encode()) for i in range(20)]

            answers = await asyncio.gather(*(caller(n) for n in range(32)))
        assert answers == [[f"{n}-{i}".encode() for i in range(20)] for n in range(32)]
        return _grpc_reader(asyncio.get_running_loop())
    finally:
        await server.stop(None)


def test_the_installed_grpcio_registers_the_handler_this_loop_batches() -> None:
    # This process's grpc.aio may already be bound to another test's loop; it binds to each
    # new loop it runs on, through add_reader, which is what is looked at here.
    with asyncio.Runner(loop_factory=new_loop) as runner:
        readers = runner.run(_calls())
    assert any(isinstance(reader, BatchedWakeups) for reader in readers), readers
