"""The host's event loop (agentsessions.host.eventloop): the accepting of calls runs ahead of the
callbacks already waiting, in order, without starving them; and the host's listener
marks grpc's accept path while its access-log interceptor clears the mark for the call's own work.

Each loop runs in this test's own thread through asyncio.Runner, as ``agentsessions serve`` runs it.
"""

from __future__ import annotations

import asyncio
import contextvars
import socket
from collections.abc import Callable, Iterator
from typing import Any, TypeVarTuple

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2

from agentsessions.host import server
from agentsessions.host.app import Service
from agentsessions.host.config import HostConfig
from agentsessions.host.eventloop import ACCEPTING, DRAIN_BATCH, AcceptFirstLoop
from agentsessions.host.server import _Listener

_Ts = TypeVarTuple("_Ts")


def accepting_context() -> contextvars.Context:
    context = contextvars.copy_context()
    context.run(ACCEPTING.set, True)
    return context


@pytest.fixture
def loop() -> Iterator[AcceptFirstLoop]:
    loop = AcceptFirstLoop()
    yield loop
    loop.close()


def run_queued(loop: asyncio.AbstractEventLoop, queue: Callable[[Callable[[], None]], None]) -> None:
    """Queue callbacks with ``queue(done)`` and run the loop until one calls ``done``."""
    finished = loop.create_future()
    queue(lambda: finished.set_result(None))
    loop.run_until_complete(finished)


def test_accepting_callbacks_run_before_the_waiting_ones_in_order(loop: AcceptFirstLoop) -> None:
    order: list[str] = []

    def trigger() -> None:
        order.append("trigger")
        loop.call_soon(order.append, "u1", context=accepting_context())
        loop.call_soon(order.append, "n3")
        loop.call_soon(order.append, "u2", context=accepting_context())

    def queue(done: Callable[[], None]) -> None:
        loop.call_soon(order.append, "n1")
        loop.call_soon(trigger)
        loop.call_soon(order.append, "n2")
        loop.call_later(0.001, done)

    run_queued(loop, queue)
    assert order == ["n1", "trigger", "u1", "u2", "n2", "n3"]


def test_what_an_accepting_callback_schedules_first_runs_right_after_it(loop: AcceptFirstLoop) -> None:
    order: list[str] = []
    context = accepting_context()

    def step(n: int) -> None:
        order.append(f"u{n}")
        if n < 3:
            loop.call_soon(step, n + 1, context=context)

    def queue(done: Callable[[], None]) -> None:
        loop.call_soon(lambda: loop.call_soon(step, 1, context=context))
        loop.call_soon(order.append, "n1")
        loop.call_soon(order.append, "n2")
        loop.call_later(0.001, done)

    run_queued(loop, queue)
    assert order == ["u1", "u2", "u3", "n1", "n2"]


def test_a_task_started_while_accepting_takes_every_step_first(loop: AcceptFirstLoop) -> None:
    order: list[str] = []

    async def accept() -> None:
        for n in range(3):
            order.append(f"a{n}")
            await asyncio.sleep(0)

    async def main() -> None:
        # Plenty of waiting callbacks, queued before the task starts.
        for n in range(5):
            loop.call_soon(order.append, f"n{n}")
        token = ACCEPTING.set(True)
        try:
            task = loop.create_task(accept())
        finally:
            ACCEPTING.reset(token)
        await task

    loop.run_until_complete(main())
    assert order[:3] == ["a0", "a1", "a2"]
    assert order[3:] == [f"n{n}" for n in range(5)]


def test_io_callbacks_keep_their_place(loop: AcceptFirstLoop) -> None:
    order: list[str] = []
    reader, writer = socket.socketpair()
    try:
        reader.setblocking(False)

        def readable() -> None:
            reader.recv(1)
            order.append("io")
            loop.remove_reader(reader)

        def queue(done: Callable[[], None]) -> None:
            writer.send(b"x")
            loop.add_reader(reader, readable)

            def chain(n: int) -> None:
                order.append(f"n{n}")
                if n < 2:
                    loop.call_soon(chain, n + 1)
                else:
                    done()

            loop.call_soon(chain, 0)

        run_queued(loop, queue)
        # As on asyncio's own loop: the reader, found ready as the first pass starts, runs after
        # n0, queued before it.
        assert order == ["n0", "io", "n1", "n2"]
    finally:
        reader.close()
        writer.close()


def test_an_endless_accepting_chain_does_not_starve_the_rest(loop: AcceptFirstLoop) -> None:
    ran: list[int] = []
    context = accepting_context()
    seen_at: list[int] = []

    def step() -> None:
        ran.append(1)
        loop.call_soon(step, context=context)

    def queue(done: Callable[[], None]) -> None:
        loop.call_soon(lambda: loop.call_soon(step, context=context))

        def waiting() -> None:
            seen_at.append(len(ran))
            done()

        loop.call_soon(waiting)

    run_queued(loop, queue)
    assert seen_at and 0 < seen_at[0] <= DRAIN_BATCH


def test_threadsafe_callbacks_and_timers_keep_their_place(loop: AcceptFirstLoop) -> None:
    order: list[str] = []
    context = accepting_context()

    def queue(done: Callable[[], None]) -> None:
        loop.call_soon(order.append, "n1")
        loop.call_soon_threadsafe(order.append, "threadsafe", context=context)
        loop.call_soon(order.append, "n2")
        loop.call_later(0.001, done)

    run_queued(loop, queue)
    assert order == ["n1", "threadsafe", "n2"]


def test_a_cancelled_or_failing_accepting_callback_leaves_the_rest_running(loop: AcceptFirstLoop) -> None:
    order: list[str] = []
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx))
    context = accepting_context()

    def fail() -> None:
        raise RuntimeError("boom")

    def trigger() -> None:
        loop.call_soon(order.append, "cancelled", context=context).cancel()
        loop.call_soon(fail, context=context)
        loop.call_soon(order.append, "after", context=context)

    def queue(done: Callable[[], None]) -> None:
        loop.call_soon(trigger)
        loop.call_later(0.001, done)

    run_queued(loop, queue)
    assert order == ["after"]
    assert [type(e.get("exception")) for e in errors] == [RuntimeError]


def test_closing_drops_what_was_queued_to_go_first() -> None:
    loop = AcceptFirstLoop()
    ran: list[str] = []
    loop.call_soon(ran.append, "never", context=accepting_context())
    assert len(loop._first) == 1
    loop.close()
    assert loop.is_closed()
    assert len(loop._first) == 0 and not loop._draining
    assert ran == []


class _CountingLoop(AcceptFirstLoop):
    def __init__(self) -> None:
        super().__init__()
        self.accepting = 0

    def call_soon(
        self,
        callback: Callable[[*_Ts], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        if ACCEPTING.get() if context is None else context.get(ACCEPTING, False):
            self.accepting += 1
        return super().call_soon(callback, *args, context=context)


class _ProbeHealth:
    """Health Check on its own service name, noting whether the call's handler was still accepting."""

    def __init__(self) -> None:
        self.accepting_in_handler: list[bool] = []

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        self.accepting_in_handler.append(ACCEPTING.get())
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


def test_the_listener_marks_the_accept_path_and_the_access_log_clears_it_for_the_call() -> None:
    probe = _ProbeHealth()

    def add(grpc_server: aio.Server) -> None:
        handler = grpc.unary_unary_rpc_method_handler(
            probe.Check,
            request_deserializer=health_pb2.HealthCheckRequest.FromString,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
        )
        probe_service = grpc.method_handlers_generic_handler("probe.Probe", {"Check": handler})
        grpc_server.add_generic_rpc_handlers((probe_service,))

    async def main(loop: _CountingLoop) -> tuple[int, int]:
        listener = _Listener("127.0.0.1:0", [Service("probe.Probe", add)], [])
        await listener.start()
        try:
            # The selector's callbacks (grpc's completion queue among them) were registered outside
            # the mark: what they schedule without a context of its own does not go first.
            selector_map = loop._selector.get_map()  # type: ignore[attr-defined]
            readers = [key.data[0] for key in selector_map.values() if key.data[0] is not None]
            assert readers and not any(r._context.get(ACCEPTING, False) for r in readers)
            async with aio.insecure_channel(listener.bound) as channel:
                check = channel.unary_unary(
                    "/probe.Probe/Check",
                    request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                    response_deserializer=health_pb2.HealthCheckResponse.FromString,
                )
                await check(health_pb2.HealthCheckRequest())
                before = loop.accepting
                response = await check(health_pb2.HealthCheckRequest())
                assert response.status == health_pb2.HealthCheckResponse.SERVING
                return before, loop.accepting
        finally:
            await listener.stop(None)

    loop = _CountingLoop()
    with asyncio.Runner(loop_factory=lambda: loop) as runner:
        before, after = runner.run(main(loop))
    # grpc's request task, its serving loop's wait and the call's tasks each stepped first.
    assert after - before >= 3
    assert probe.accepting_in_handler == [False, False]
    assert ACCEPTING.get() is False  # the mark never leaks out of the listener's start


def test_serve_runs_on_the_accept_first_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def serve(config: HostConfig) -> int:
        loops.append(asyncio.get_running_loop())
        return 0

    monkeypatch.setattr(server, "serve", serve)
    assert server.serve_on_host_loop(HostConfig(journal="memory:")) == 0
    assert [type(loop) for loop in loops] == [AcceptFirstLoop]
    assert loops[0].is_closed()


@pytest.mark.parametrize("accepting", [False, True])
def test_call_soon_keeps_asyncios_checks(accepting: bool) -> None:
    """The quick path skips nothing asyncio's call_soon checks: a closed loop raises, and in debug
    mode a call from another thread or of something not callable raises."""
    context = accepting_context() if accepting else None
    loop = AcceptFirstLoop()
    loop.set_debug(True)
    try:
        with pytest.raises(TypeError, match="callable"):
            loop.call_soon("not callable", context=context)  # type: ignore[arg-type]
        loop.call_soon(print, context=context).cancel()  # no thread check before the loop runs
        errors: list[BaseException] = []

        async def from_another_thread() -> None:
            def call() -> None:
                try:
                    loop.call_soon(print, context=context)
                except RuntimeError as exc:
                    errors.append(exc)

            await asyncio.to_thread(call)

        loop.run_until_complete(from_another_thread())
        assert [str(e) for e in errors] == [
            "Non-thread-safe operation invoked on an event loop other than the current one"
        ]
    finally:
        loop.close()
    with pytest.raises(RuntimeError, match="Event loop is closed"):
        loop.call_soon(print, context=context)


def test_call_soon_on_the_quick_path_queues_a_plain_handle_in_order(loop: AcceptFirstLoop) -> None:
    handles = [loop.call_soon(print, n) for n in range(3)]
    assert list(loop._ready) == handles  # type: ignore[attr-defined]
    assert all(type(h) is asyncio.Handle and h._source_traceback is None for h in handles)  # type: ignore[attr-defined]
    assert all(h._context is not None for h in handles)  # type: ignore[attr-defined]
    for h in handles:
        h.cancel()
