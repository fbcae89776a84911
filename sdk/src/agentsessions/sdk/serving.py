"""Serving a harness over gRPC: bind, start, stop (the servicer itself is in ``servicer``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Callable

import grpc

from agentsessions.sdk import grpcloop
from agentsessions.sdk.harness import Harness, require_harness
from agentsessions.sdk.limits import MAX_MESSAGE_BYTES, MESSAGE_SIZE_OPTIONS
from agentsessions.sdk.servicer import HarnessServicer, add_to_server
from agentsessions.sdk.structs import struct
from agentsessions.sdk.tls import ServerTLS, add_port

# The server options every harness server uses (the old name, kept for importers).
GRPC_OPTIONS = MESSAGE_SIZE_OPTIONS
__all__ = ["GRPC_OPTIONS", "MAX_MESSAGE_BYTES", "HarnessServer", "run_server", "serve", "start_server"]


@struct
class HarnessServer:
    """A running harness server: the address it is bound to and how to stop it."""

    server: grpc.aio.Server
    address: str

    async def stop(self, grace: float | None = 5.0) -> None:
        await self.server.stop(grace)

    async def wait_for_termination(self) -> None:
        await self.server.wait_for_termination()


async def start_server(
    harness: Harness,
    address: str,
    *,
    servicer: HarnessServicer | None = None,
    tls: ServerTLS | None = None,
) -> HarnessServer:
    """Bind ``address`` (``host:port``, port 0 picks one, or ``unix:path``) and start serving,
    over TLS (mutual TLS when ``tls`` names a client CA) when ``tls`` is given. Raises TypeError
    before binding anything when ``harness`` is not a harness."""
    require_harness(harness, "start_server")
    server = grpc.aio.server(options=GRPC_OPTIONS)
    add_to_server(servicer or HarnessServicer(harness), server)
    try:
        port = add_port(server, address, tls)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {address!r}: {exc}") from exc
    await server.start()
    return HarnessServer(server=server, address=_bound_address(address, port))


async def serve(
    harness: Harness,
    address: str,
    *,
    grace: float = 5.0,
    on_ready: Callable[[str], None] | None = None,
    tls: ServerTLS | None = None,
) -> None:
    """Serve ``harness`` on ``address`` until cancelled, then stop gracefully."""
    require_harness(harness, "serve")
    running = await start_server(harness, address, tls=tls)
    if on_ready is not None:
        on_ready(running.address)
    try:
        await running.wait_for_termination()
    finally:
        await asyncio.shield(running.stop(grace))


def run_server(
    harness: Harness,
    address: str,
    *,
    grace: float = 5.0,
    on_ready: Callable[[str], None] | None = None,
    tls: ServerTLS | None = None,
    stop_on_stdin_eof: bool = False,
) -> None:
    """Blocking :func:`serve` that stops gracefully on SIGINT or SIGTERM and, with
    ``stop_on_stdin_eof``, once standard input reaches end of file."""
    import signal

    require_harness(harness, "run_server")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, task.cancel)
        if stop_on_stdin_eof:
            _stop_when_stdin_closes(loop, task)
        with contextlib.suppress(asyncio.CancelledError):
            await serve(harness, address, grace=grace, on_ready=on_ready, tls=tls)

    # grpc.aio's completions in one pass per wake-up (agentsessions.sdk.grpcloop).
    with asyncio.Runner(loop_factory=grpcloop.new_loop) as runner:
        runner.run(main())


def _stop_when_stdin_closes(loop: asyncio.AbstractEventLoop, task: asyncio.Task[None]) -> None:
    """Stop ``task`` (gracefully, as SIGTERM does) once standard input reaches end of file.

    A host that starts this process holds the pipe's other end and never writes to it; when the
    host goes away, even by SIGKILL, the kernel closes that end, so the harness does not outlive it.
    A thread blocks on the read: it works for any kind of standard input, not only pipes."""

    def watch() -> None:
        with contextlib.suppress(OSError):  # a standard input that cannot be read is closed
            while os.read(0, 65536):
                pass
        # Said before the stop is asked: once the loop ends, the process may exit before this
        # daemon thread runs again (CI saw the line lost). The process that held standard input may
        # have held stderr too: it may be gone as well.
        with contextlib.suppress(OSError):
            print("agentsessions-harness: standard input closed: stopping", file=sys.stderr, flush=True)
        with contextlib.suppress(RuntimeError):  # the loop has already finished
            loop.call_soon_threadsafe(task.cancel)

    threading.Thread(target=watch, name="agentsessions-stdin-lifeline", daemon=True).start()


def _bound_address(address: str, port: int) -> str:
    if address.startswith("unix:"):
        return address
    host, _, _ = address.rpartition(":")
    return f"{host}:{port}"
