"""What the host serves: the servicers built from a ``HostConfig``, and how to release them.

``server.serve`` asks ``build_app`` for an ``App`` and registers, reflects and health-reports
``App.services`` on the Sessions listener and ``App.admin_services`` on the ``--registry-addr``
listener (not served when that flag is unset). ``App.close`` runs once the server has drained.

The wiring: journal store -> harness catalog (built-in ``echo``/``chat``/``counter`` in-process,
``--harness`` entries dialled, ``--harness-process`` children started, registry entries from the
store) -> model provider (built-in echo, or the OpenAI-compatible provider with ``--model``) -> tool
registry -> controller -> servicers.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable
from dataclasses import field

from grpc import aio

from agentsessions.ext.v1 import compaction_pb2_grpc, live_pb2_grpc, subagents_pb2_grpc
from agentsessions.host.auth import AuthFileError, AuthInterceptor, PrincipalAccess, load_principals
from agentsessions.host.auth.principals import ADMIN, Principal
from agentsessions.host.callcontext import ANONYMOUS, CallContext
from agentsessions.host.config import ConfigError, HostConfig
from agentsessions.host.controller.access import SessionAccess
from agentsessions.host.controller.approval_policy import ApprovalPolicy
from agentsessions.host.controller.compaction import CompactionSettings
from agentsessions.host.controller.controller import Controller
from agentsessions.host.controller.harnesses import BuiltinHarness, HarnessCatalog, StaticHarness
from agentsessions.host.controller.live import LiveSettings
from agentsessions.host.harnesslink import RemoteHarness
from agentsessions.host.idempotency import IdempotencyInterceptor
from agentsessions.host.journal import open_store
from agentsessions.host.models.echo import EchoModel
from agentsessions.host.models.openai import OpenAIModel
from agentsessions.host.models.provider import ModelProvider
from agentsessions.host.runtime import HarnessProcessError, HarnessProcesses
from agentsessions.host.service import compaction, live, registry, sessions, subagents
from agentsessions.host.service.decoding import DecodingInterceptor
from agentsessions.host.service.result_schema import ResultSchemaInterceptor
from agentsessions.host.telemetry import TracedModel, TracedTools
from agentsessions.host.telemetry import switch as telemetry_switch
from agentsessions.host.tools.config import tools_config_from_flags
from agentsessions.sdk.structs import struct
from agentsessions.sdk.tls import TLSFilesError
from agentsessions.v1 import harness_registry_pb2_grpc

# The host's own authority, for what it does with no caller (queued turns): never a token's.
HOST_PRINCIPAL = Principal("host:live", projects=None, roles=frozenset({ADMIN}))


class StartupError(Exception):
    """The host could not start serving (a harness process that cannot start, a bad token file,
    the listen address taken, ...)."""


@struct(frozen=True)
class Service:
    """One gRPC service: its full name (for reflection and health) and how to add it to a server."""

    name: str
    add_to_server: Callable[[aio.Server], None]


@struct
class App:
    services: list[Service]
    admin_services: list[Service] = field(default_factory=list)
    # Run inside the access log, in order (authentication goes here).
    interceptors: list[aio.ServerInterceptor] = field(default_factory=list)
    controller: Controller | None = None
    _closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    _drainers: list[Callable[[], None]] = field(default_factory=list)

    def on_drain(self, drainer: Callable[[], None]) -> None:
        """Register what to tell when the host starts draining (before calls are cut)."""
        self._drainers.append(drainer)

    def begin_drain(self) -> None:
        for drainer in self._drainers:
            drainer()

    def on_close(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Register a release step; ``close`` runs them last-registered first."""
        self._closers.append(closer)

    async def close(self) -> None:
        """Run every release step even when one fails; then raise what failed."""
        errors: list[Exception] = []
        while self._closers:
            try:
                await self._closers.pop()()
            except Exception as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise ExceptionGroup("closing the app", errors)


def build_model(config: HostConfig) -> ModelProvider:
    """The built-in echo model, or the OpenAI-compatible provider when ``--model`` is set; each
    completion is traced as a GenAI ``chat`` span (agentsessions.host.telemetry)."""
    if not config.model:
        return TracedModel(EchoModel(), provider_name="echo", default_model="echo")
    return TracedModel(
        OpenAIModel(
            config.model,
            base_url=config.model_base_url,
            path=config.model_path,
            auth_header=config.model_auth_header,
            **config.model_transport.provider_options(),
        ),
        provider_name="openai",
        default_model=config.model,
    )


async def build_controller(
    config: HostConfig, app: App, *, access: SessionAccess | None = None, live: bool = False
) -> Controller:
    """The journal store, harness catalog, model, tools and controller ``config`` describes, with
    no server; their release steps go on ``app``. ``serve`` and ``agentsessions replay`` share it.
    ``access`` is the controller's authorization hook (None: open, as without ``--auth-tokens``);
    ``live`` gives the controller its leases, keys, queues and recovery (``serve`` only), started
    here and stopped first on close."""
    harness_tls = config.harness_tls
    try:
        harness_credentials = harness_tls.credentials() if harness_tls is not None else None
    except TLSFilesError as exc:
        raise ConfigError(f"--harness-tls-*: {exc}") from None
    store = await open_store(config.journal, kept_listed=config.limits.max_kept_listed_sessions)
    app.on_close(store.close)

    remotes: list[RemoteHarness] = []

    def dial(address: str) -> RemoteHarness:
        harness = RemoteHarness(
            address, credentials=harness_credentials, describe_max_age=config.harness_describe_max_age
        )
        remotes.append(harness)
        return harness

    async def close_remotes() -> None:
        for harness in remotes:
            await harness.close()

    app.on_close(close_remotes)
    static = {
        "echo": StaticHarness(BuiltinHarness("agentsessions.harnesses.echo:EchoHarness")),
        "chat": StaticHarness(BuiltinHarness("agentsessions.harnesses.chat:ChatHarness")),
        # Needs memory snapshots, which no runtime here takes: served so the refusal can be seen.
        "counter": StaticHarness(BuiltinHarness("agentsessions.harnesses.counter:CounterHarness")),
    }
    for name, address in config.harnesses:
        static[name] = StaticHarness(dial(address), address)
    processes = HarnessProcesses(
        config.harness_processes,
        grace=config.drain_grace_seconds,
        describe_max_age=config.harness_describe_max_age,
    )
    app.on_close(processes.close)
    await processes.start()
    for name, runtime in processes.runtimes.items():
        static[name] = StaticHarness(runtime.harness, runtime.address, runtime=runtime)
    catalog = HarnessCatalog(static, store, dial, default="echo")

    tools = tools_config_from_flags(config.tool_executors, config.mcp_servers, config.tools_files)
    registry_of_tools = tools.build_registry(store)
    await registry_of_tools.start()
    app.on_close(registry_of_tools.stop)

    controller = Controller(
        store,
        catalog,
        build_model(config),
        TracedTools(registry_of_tools),
        default_project=config.project,
        purge_on_delete=config.purge_on_delete,
        write_ahead_model_calls=config.write_ahead_model_calls,
        approval_policy=ApprovalPolicy.from_file(config.approval_policy) if config.approval_policy else None,
        access=access,
        limits=config.limits,
        live=live_settings(config, authenticated=access is not None) if live else None,
        result_corrections=config.result_corrections,
        compaction=CompactionSettings(
            above_events=config.compact_above_events, above_bytes=config.compact_above_bytes
        ),
    )
    app.controller = controller
    if controller.live is not None:
        live_parts = controller.live
        await live_parts.start()
        app.on_drain(live_parts.drain)
        app.on_close(lambda: live_parts.close(config.drain_grace_seconds))
    return controller


def live_settings(config: HostConfig, *, authenticated: bool) -> LiveSettings:
    ttl = config.lease_ttl_seconds
    return LiveSettings(
        recover=config.recover,
        attempts=config.recover_attempts,
        backoff_s=config.recover_backoff_seconds,
        lease_ttl_s=ttl,
        scan_s=min(1.0, ttl / 3),
        key_retention_s=config.idempotency_retention_seconds,
        detach_exec=config.detach_exec,
        host_call=CallContext(HOST_PRINCIPAL, "host") if authenticated else ANONYMOUS,
        subagents=dataclasses.replace(config.subagents, scan_s=min(1.0, ttl / 3)),
    )


async def build_app(config: HostConfig) -> App:
    # Outermost after the access log: unauthenticated calls get their span and duration too. With
    # nothing recording (no provider installed, here or by an embedding application) it is left out.
    traced = telemetry_switch.refresh()
    app = App(services=[])
    if traced:
        from agentsessions.host.telemetry.rpc import TelemetryInterceptor  # the API, only when traced

        app.interceptors.append(TelemetryInterceptor())
    access: SessionAccess | None = None
    try:
        if config.auth_tokens is not None:
            # Every call but health and reflection needs a principal (docs/security.md).
            app.interceptors.append(AuthInterceptor(load_principals(config.auth_tokens)))
            access = PrincipalAccess()
        controller = await build_controller(config, app, access=access, live=True)
    except (HarnessProcessError, AuthFileError, ConfigError) as exc:
        await app.close()
        raise StartupError(str(exc)) from exc
    # The idempotency key joins the call context authentication bound.
    app.interceptors.append(IdempotencyInterceptor())
    app.interceptors.append(ResultSchemaInterceptor())  # Exec's agentsessions-result-schema
    # Innermost: undecodable request bytes answer INVALID_ARGUMENT, after authentication.
    app.interceptors.append(DecodingInterceptor())
    sessions_servicer = sessions.SessionsServicer(controller)
    app.services.append(
        Service(
            sessions.SERVICE_NAME,
            functools.partial(sessions.add_to_server, sessions_servicer),
        )
    )
    if controller.live is not None:
        live_servicer = live.LiveSessionsServicer(controller)
        app.services.append(
            Service(
                live.SERVICE_NAME,
                functools.partial(live_pb2_grpc.add_LiveSessionsServicer_to_server, live_servicer),
            )
        )
        subagents_servicer = subagents.SubagentsServicer(controller)
        app.services.append(
            Service(
                subagents.SERVICE_NAME,
                functools.partial(subagents_pb2_grpc.add_SubagentsServicer_to_server, subagents_servicer),
            )
        )
    compaction_servicer = compaction.SessionCompactionServicer(controller)
    app.services.append(
        Service(
            compaction.SERVICE_NAME,
            functools.partial(
                compaction_pb2_grpc.add_SessionCompactionServicer_to_server, compaction_servicer
            ),
        )
    )
    registry_servicer = registry.HarnessRegistryServicer(controller.catalog)
    app.admin_services.append(
        Service(
            registry.SERVICE_NAME,
            functools.partial(
                harness_registry_pb2_grpc.add_HarnessRegistryServicer_to_server, registry_servicer
            ),
        )
    )
    return app
