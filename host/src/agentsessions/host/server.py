"""``agentsessions serve``: the host's gRPC server, its health, reflection and graceful drain.

Each listener is a ``grpc.aio`` server carrying the app's services, ``grpc.health.v1.Health`` and
server reflection, behind the access-log interceptor. SIGTERM or SIGINT starts the drain: every
health status turns NOT_SERVING, the listeners stop accepting calls, in-flight calls get the grace
period to finish (a second signal cuts it short), the app is closed, and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from grpc import aio
from grpc_health.v1 import health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from agentsessions.host import config as host_config
from agentsessions.host import eventloop, health, logs
from agentsessions.host.accesslog import AccessLogInterceptor
from agentsessions.host.addresses import is_loopback
from agentsessions.host.app import App, Service, StartupError, build_app
from agentsessions.host.config import ConfigError, HostConfig
from agentsessions.host.journalwatch import JournalWatch
from agentsessions.host.telemetry import setup as telemetry
from agentsessions.sdk import grpcenv
from agentsessions.sdk.tls import ServerTLS, TLSFilesError, add_port

log = logging.getLogger("agentsessions.host")

# A second host on a busy port must fail to start, not share the port.
_SERVER_OPTIONS = (("grpc.so_reuseport", 0),)


def add_parser(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="serve the agentsessions.v1 host",
        description="Serve agentsessions.v1 Sessions with gRPC health and server reflection. "
        "Every flag can also come from its AGENTSESSIONS_* environment variable; the flag wins.",
    )
    host_config.add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The ``serve`` subcommand: exit 0 after a drain, 1 when serving fails, 2 on bad configuration."""
    try:
        config = HostConfig.from_sources(args, os.environ)
    except ConfigError as exc:
        print(f"agentsessions serve: error: {exc}", file=sys.stderr)
        return 2
    logs.configure(config.log_level, config.log_format, background=True)
    try:
        installed = telemetry.install(config.otel_exporter)
    except telemetry.TelemetryError as exc:
        print(f"agentsessions serve: error: {exc}", file=sys.stderr)
        return 2
    collect_garbage_for_serving()
    try:
        return serve_on_host_loop(config)
    except StartupError as exc:
        log.error("startup failed", extra=logs.fields(error=str(exc)))
        return 1
    finally:
        # Flushes what is still batched (spans of the drain, the last metrics).
        installed.shutdown()


# The youngest generation is collected after this many new container objects (CPython: 700), the
# middle one after this many collections of the youngest (CPython: 10).
GC_YOUNG_THRESHOLD = 50_000
GC_MIDDLE_THRESHOLD = 3


def collect_garbage_for_serving() -> None:
    """The collector tuned for a host process. At CPython's default a loaded host collects its
    young objects 130 times a second, and everything a turn holds lives across two of those
    collections, so it reaches the oldest generation, whose collections then run every second
    and pause the event loop for 60-240 ms each (bench/load.py: 3.4 s of 30 s in the collector).

    A young collection walks mostly the turns in flight, so its pause grows with the threshold;
    a middle one walks what the host kept since the last one. bench/load.py, 200 sessions with
    readers, one phase (~75 s of a host's life; bench/NOTEBOOK.md, "The collector at 50,000"): at
    50,000 and 3, ~40 young collections of ~15 ms (max 25 ms) and 10 middle ones of ~20 ms (max
    51 ms), 0.8 s in the collector; at 100,000 and 3, 4 young ones of 43-47 ms (max 67 ms) and one
    middle one of ~90 ms, 0.3 s. A listing's p99 in four alternated runs each: 74.4-87.0 ms at
    50,000, 85.6-132.7 ms at 100,000. (Before the journal cache kept its events encoded, a middle
    collection at 50,000 and 20 took 120-150 ms, and 100,000 was the better choice.) Garbage
    waiting for a collection is bounded by the thresholds.

    What the process holds by now (its modules, classes and configuration, ~60,000 objects, all
    living as long as it does) is frozen out of the collector's sight (``gc.freeze``), so no later
    collection walks it again."""
    gc.freeze()
    oldest = gc.get_threshold()[2]
    gc.set_threshold(GC_YOUNG_THRESHOLD, GC_MIDDLE_THRESHOLD, oldest)


def serve_on_host_loop(config: HostConfig) -> int:
    """``serve(config)`` on the host's event loop, where the accepting of calls goes ahead of the
    running turns (eventloop.py)."""
    with asyncio.Runner(loop_factory=eventloop.new_loop) as runner:
        return runner.run(serve(config))


async def serve(
    config: HostConfig,
    *,
    stop: asyncio.Event | None = None,
    on_serving: Callable[[Sequence[str]], None] | None = None,
) -> int:
    """Serve until SIGTERM or SIGINT (or ``stop`` is set), then drain; returns the process exit code.

    ``on_serving`` receives the bound listen addresses (Sessions first, HTTP last) once every
    listener is up.
    """
    signals = _Signals(stop or asyncio.Event())
    with signals.installed():
        app = await build_app(config)
        listeners: list[_Serving] = []
        try:
            listeners = _listeners(config, app)
            for listener in listeners:
                await listener.start()
            _watch_journal(app, [listener.health for listener in listeners])
            log.info("serving", extra=logs.fields(**_startup_facts(config, app, listeners)))
            if config.auth_tokens is None and config.tls_client_ca is None and not is_loopback(config.listen):
                # Only with --insecure-allow-unauthenticated: the configuration refuses it otherwise.
                log.warning(
                    "no authentication (--insecure-allow-unauthenticated): anyone who reaches this "
                    "address can read, run and approve every session (docs/security.md)",
                    extra=logs.fields(listen=config.listen),
                )
            if on_serving is not None:
                on_serving([listener.bound for listener in listeners])
            await signals.first.wait()
            log.info("draining", extra=logs.fields(grace_seconds=config.drain_grace_seconds))
            app.begin_drain()
            await _drain(listeners, config.drain_grace_seconds, signals.second)
        finally:
            # After a drain this is a no-op; after a failed start it releases the listeners that did start.
            await _stop_all(listeners, None)
            await app.close()
    log.info("stopped")
    return 0


def _watch_journal(app: App, healths: Sequence[health.HealthServicer]) -> None:
    """NOT_SERVING while the journal takes no writes, probing until it does (journalwatch); the
    watch ends when the app closes."""
    if app.controller is None:
        return
    task = asyncio.create_task(JournalWatch(app.controller.store, healths).run(), name="journal-watch")

    async def stop() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.on_close(stop)


def _startup_facts(config: HostConfig, app: App, listeners: Sequence[_Serving]) -> dict[str, Any]:
    facts: dict[str, Any] = {"listen": listeners[0].bound}
    if config.http_listen:  # the HTTP listener comes last
        facts["http"] = listeners[-1].bound
        listeners = listeners[:-1]
    if len(listeners) > 1:
        facts["registry"] = listeners[1].bound
    facts["journal"] = config.journal_kind
    if config.journal_kind == "sqlite":
        # A postgres URL may carry a password, so only a file path is logged.
        facts["journal_path"] = config.journal
    facts["project"] = config.project
    tls = config.server_tls
    facts["tls"] = "off" if tls is None else "mutual" if tls.mutual else "on"
    facts["auth"] = "tokens" if config.auth_tokens else "off"
    facts["services"] = [service.name for service in app.services]
    # Every static harness the host serves: built in, --harness and --harness-process.
    facts["harnesses"] = (
        app.controller.catalog.static_names()
        if app.controller is not None
        else [name for name, _ in config.harnesses]
    )
    facts["model"] = config.model or "echo (built in)"
    # What gRPC core read at import: the transport the command chose or the environment's setting.
    experiments = os.environ.get(grpcenv.VARIABLE)
    if experiments:
        facts["grpc_experiments"] = experiments
    facts["pid"] = os.getpid()
    return facts


def _listeners(config: HostConfig, app: App) -> list[_Serving]:
    tls = config.server_tls
    listeners: list[_Serving] = [_Listener(config.listen, app.services, app.interceptors, tls)]
    if config.registry_addr and app.admin_services:
        listeners.append(_Listener(config.registry_addr, app.admin_services, app.interceptors, tls))
    elif app.admin_services:
        names = [service.name for service in app.admin_services]
        log.info("admin services not served: set --registry-addr", extra=logs.fields(services=names))
    if config.http_listen:
        # Imported here: aiohttp costs start-up ~130 ms, and only --http-listen serves HTTP.
        from agentsessions.host.http import HttpListener

        # The HTTP API calls the Sessions listener's services, with its interceptors, on a private socket.
        private = functools.partial(_Listener, services=app.services, interceptors=app.interceptors)
        listeners.append(HttpListener(config, private))
    return listeners


class _Serving(Protocol):
    """A listener ``serve`` starts, health-drains and stops: a gRPC ``_Listener`` or the HTTP one."""

    bound: str

    @property
    def health(self) -> health.HealthServicer: ...

    async def start(self) -> None: ...

    async def stop(self, grace: float | None) -> None: ...


async def _drain(listeners: Sequence[_Serving], grace: float, cut_short: asyncio.Event) -> None:
    for listener in listeners:
        await listener.health.drain()
    stopping = asyncio.create_task(_stop_all(listeners, grace))
    interrupted = asyncio.create_task(cut_short.wait())
    try:
        racing: set[asyncio.Future[Any]] = {stopping, interrupted}
        await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        if not stopping.done():
            log.info("drain cut short: cancelling in-flight calls")
            await _stop_all(listeners, None)
        # Bounded: grpc cancels whatever is left when the grace period (or the cut) ends.
        await stopping
    finally:
        interrupted.cancel()


async def _stop_all(listeners: Sequence[_Serving], grace: float | None) -> None:
    await asyncio.gather(*(listener.stop(grace) for listener in listeners))


class _Listener:
    """One gRPC server: the given services plus health and reflection, on one address (over TLS
    when ``tls`` is given)."""

    def __init__(
        self,
        address: str,
        services: Sequence[Service],
        interceptors: Sequence[aio.ServerInterceptor],
        tls: ServerTLS | None = None,
    ) -> None:
        self.address = address
        self.bound = address
        self.tls = tls
        names = [service.name for service in services]
        self.health = health.HealthServicer(names)
        self.server = aio.server(
            interceptors=[AccessLogInterceptor(), *interceptors], options=_SERVER_OPTIONS
        )
        for service in services:
            service.add_to_server(self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )

    async def start(self) -> None:
        try:
            port = add_port(self.server, self.address, self.tls)
        except TLSFilesError as exc:
            raise StartupError(f"cannot serve TLS on {self.address}: {exc}") from None
        except RuntimeError as exc:
            raise StartupError(f"cannot listen on {self.address}: {exc}") from None
        if self.address.endswith(":0"):
            self.bound = f"{self.address[:-2]}:{port}"
        # grpc's serving task, and every call's tasks after it, inherit ACCEPTING from here: a
        # call's accept path goes first until the access-log interceptor clears it (eventloop.py).
        accepting = eventloop.ACCEPTING.set(True)
        try:
            await self.server.start()
        finally:
            eventloop.ACCEPTING.reset(accepting)
        await self.health.serving()

    async def stop(self, grace: float | None) -> None:
        await self.server.stop(grace)


class _Signals:
    """SIGTERM/SIGINT as events: the first starts the drain, the second cuts it short."""

    def __init__(self, first: asyncio.Event) -> None:
        self.first = first
        self.second = asyncio.Event()

    def _received(self, signum: int) -> None:
        if self.first.is_set():
            log.info("second signal", extra=logs.fields(signal=signal.Signals(signum).name))
            self.second.set()
        else:
            log.info("signal", extra=logs.fields(signal=signal.Signals(signum).name))
            self.first.set()

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._received, signum)
        try:
            yield
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
