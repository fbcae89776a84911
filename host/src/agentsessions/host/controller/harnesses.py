"""Which harness serves a session: the host's static harnesses (in-process or dialled
addresses) and HarnessRegistry entries, resolved by name; and the admission check every path that
runs a harness makes first (Describe, bounded, then placement on the harness's runtime)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from agentsessions.host.controller.errors import (
    FailedPreconditionError,
    HarnessMisdescribedError,
    HarnessUnavailableError,
    InvalidArgumentError,
    UnplaceableError,
)
from agentsessions.host.controller.modes import session_mode
from agentsessions.host.journal.store import JournalStore, SessionRow
from agentsessions.host.runtime import InProcessRuntime, RemoteRuntime, Runtime, placement_refusal
from agentsessions.host.telemetry import switch
from agentsessions.sdk.harness import EventSink, Harness, Start
from agentsessions.sdk.structs import struct
from agentsessions.v1 import harness_pb2, harness_registry_pb2

DESCRIBE_TIMEOUT_S = 10.0

# Builds a Harness that dials an address (host:port, dns:///..., unix:...).
RemoteFactory = Callable[[str], Harness]


class BuiltinHarness:
    """A harness shipped with the host, named as ``agentsessions-harness serve`` names one
    (``module:attribute``), imported and built at its first use: a host whose sessions never run
    it does not load it, nor the SDK's native API it is written with."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._harness: Harness | None = None

    def loaded(self) -> Harness:
        """The harness object, built on the first call (``agentsessions.sdk.cli.load_harness``)."""
        if self._harness is None:
            from agentsessions.sdk.cli import load_harness  # loads the SDK's server side: first use only

            self._harness = load_harness(self._target)
        return self._harness

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return await self.loaded().describe()

    async def run(self, start: Start, sink: EventSink) -> None:
        await self.loaded().run(start, sink)

    def __getattr__(self, name: str) -> Any:
        # Whatever else the harness offers (``cancel``, say) is the loaded object's own; private
        # names are this wrapper's (missing ones, as on a copy made without __init__, stay missing).
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.loaded(), name)


@struct(frozen=True)
class StaticHarness:
    """A harness from the host's own configuration: in-process, or dialled at ``address``."""

    harness: Harness
    address: str = ""
    # Where it runs (None: in-process, or a remote address the host does not own).
    runtime: Runtime | None = None


@struct(frozen=True)
class ResolvedHarness:
    """A harness ready to be described and run, with how it is placed."""

    name: str
    harness: Harness
    registered: bool  # from HarnessRegistry (pinned: no per-turn override onto or off it)
    in_process: bool  # runs inside the host process
    descriptor_id: str = ""  # what the registration says Describe must report, if set
    runtime: Runtime | None = None  # set by the catalog; see placed_on

    def placed_on(self) -> Runtime:
        """The runtime serving this harness: what placement checks and Suspend snapshots."""
        if self.runtime is not None:
            return self.runtime
        return InProcessRuntime(self.harness) if self.in_process else RemoteRuntime("", self.harness)


class HarnessCatalog:
    """Static harnesses by name plus registry entries read through the journal store."""

    def __init__(
        self,
        static: Mapping[str, StaticHarness],
        store: JournalStore,
        remote_factory: RemoteFactory,
        default: str = "echo",
    ) -> None:
        self._static = dict(static)
        self.store = store
        self._remote_factory = remote_factory
        self._remote_cache: dict[str, Harness] = {}
        self._runtimes: dict[str, Runtime] = {
            name: entry.runtime
            or (
                RemoteRuntime(entry.address, entry.harness)
                if entry.address
                else InProcessRuntime(entry.harness)
            )
            for name, entry in self._static.items()
        }
        self.default = default

    def static_names(self) -> list[str]:
        return sorted(self._static)

    def is_static(self, name: str) -> bool:
        return name in self._static

    def static_address(self, name: str) -> str:
        """The dialled address of a static harness ("" for an in-process one)."""
        entry = self._static.get(name)
        return entry.address if entry is not None else ""

    async def names(self) -> list[str]:
        regs = await self.store.list_harnesses()
        return sorted(set(self._static) | {r.metadata.name for r in regs})

    async def resolve(self, name: str, *, for_new_session: bool = False) -> ResolvedHarness:
        """Look a harness up by name. Unknown -> InvalidArgumentError; a retired registration
        refuses new sessions (FailedPreconditionError) but keeps serving existing ones."""
        name = name or self.default
        static = self._static.get(name)
        if static is not None:
            return ResolvedHarness(
                name,
                static.harness,
                registered=False,
                in_process=not static.address,
                runtime=self._runtimes[name],
            )
        reg = await self.store.get_harness(name)
        if reg is None:
            known = ", ".join(await self.names())
            raise InvalidArgumentError("harness", f"unknown harness {name!r} (registered: {known})")
        if for_new_session and reg.state == harness_registry_pb2.HARNESS_STATE_RETIRED:
            raise FailedPreconditionError(f"harness {name!r} is retired and admits no new sessions")
        if reg.spec.WhichOneof("placement") != "remote":
            raise FailedPreconditionError(f"harness {name!r} has a placement this host cannot serve")
        address = reg.spec.remote.address
        harness = self._remote_cache.get(address)
        if harness is None:
            harness = self._remote_factory(address)
            self._remote_cache[address] = harness
            self._runtimes[address] = RemoteRuntime(address, harness)
        return ResolvedHarness(
            name,
            harness,
            registered=True,
            in_process=False,
            descriptor_id=reg.spec.descriptor_id,
            runtime=self._runtimes.get(address) or RemoteRuntime(address, harness),
        )


_RESUMABILITIES: Final = frozenset(harness_pb2.Resumability.values())


# A harness's ``open_ahead`` (``agentsessions.host.harnesslink.RemoteHarness.open_ahead``).
OpenAhead = Callable[[Start, str], Awaitable[Callable[[], None]]]


async def open_ahead(
    resolved: ResolvedHarness, start: Start, row: SessionRow, *, others_busy: bool
) -> Callable[[], None] | None:
    """Open the stream of a new live execution of ``row``'s session before its first records are
    durable, where the harness can: the harness takes the call while the host commits them, and
    ``start`` goes on it only when the harness is run with it (a first append that fails never runs
    the harness: call what this returns, and the stream is cut unstarted; a no-op once it ran).

    None where nothing is opened ahead: a harness in this process; a traced host (the stream
    carries the turn's trace context, and the turn's span begins when the harness runs); and a host
    where other sessions are in use (``others_busy``: their turns at whatever step), whose event
    loop has their work for that time, so the turn gains nothing and the harness's extra wakeup
    (the call and its Start arriving apart) costs the machine CPU (bench/NOTEBOOK.md, "The stream
    opened ahead")."""
    opener: OpenAhead | None = getattr(resolved.harness, "open_ahead", None)
    if opener is None or others_busy or switch.enabled():
        return None
    return await opener(start, session_mode(row))


async def describe(
    resolved: ResolvedHarness, bound_s: float = DESCRIBE_TIMEOUT_S
) -> harness_pb2.HarnessDescriptor:
    """Describe a harness at admission, bounded; failures are UNAVAILABLE-class errors."""
    # A harness dialled over gRPC keeps what it described on the current connection (see
    # RemoteHarness.describe): taken as it is, with no await or timeout scope per admission.
    current = getattr(resolved.harness, "current_descriptor", None)
    descriptor = current() if current is not None else None
    if descriptor is None:
        descriptor = await _describe_bounded(resolved, bound_s)
    check_descriptor(resolved.name, descriptor)
    if resolved.descriptor_id and descriptor.id != resolved.descriptor_id:
        raise FailedPreconditionError(
            f"harness {resolved.name!r} reports descriptor id {descriptor.id!r}, "
            f"registration requires {resolved.descriptor_id!r}"
        )
    return descriptor


async def _describe_bounded(resolved: ResolvedHarness, bound_s: float) -> harness_pb2.HarnessDescriptor:
    try:
        # A timeout scope, not wait_for: no extra task per admission.
        async with asyncio.timeout(bound_s):
            descriptor: harness_pb2.HarnessDescriptor = await resolved.harness.describe()
    except TimeoutError as exc:
        raise HarnessUnavailableError(
            f"harness {resolved.name!r} did not answer Describe within {bound_s:g}s"
        ) from exc
    except (asyncio.CancelledError, HarnessMisdescribedError):
        raise
    except Exception as exc:
        raise HarnessUnavailableError(f"harness {resolved.name!r} is unreachable: {exc}") from exc
    return descriptor


async def describe_placed(resolved: ResolvedHarness) -> harness_pb2.HarnessDescriptor:
    """Describe the harness and check that its runtime can serve what it declares (Exec, Resume,
    Fork and replay admission); UnplaceableError when it cannot, before anything is journaled."""
    descriptor = await describe(resolved)
    # The runtime decides (agentsessions.host.runtime.placement): capabilities vs the descriptor.
    refusal = placement_refusal(resolved.placed_on(), resolved.name, descriptor)
    if refusal is not None:
        raise UnplaceableError(refusal)
    return descriptor


def check_descriptor(name: str, descriptor: object) -> None:
    """A Describe answer the host can place: a descriptor with an id and a resumability this host
    knows (unstated is allowed); HarnessMisdescribedError naming what is wrong otherwise."""
    if not isinstance(descriptor, harness_pb2.HarnessDescriptor):
        raise HarnessMisdescribedError(f"harness {name!r} answered Describe with no HarnessDescriptor")
    if not descriptor.id:
        raise HarnessMisdescribedError(
            f"harness {name!r} describes itself without an id (HarnessDescriptor.id)"
        )
    resumability = descriptor.capabilities.resumability
    if resumability not in _RESUMABILITIES:
        raise HarnessMisdescribedError(
            f"harness {name!r} declares resumability {resumability}, which this host does not know "
            f"(known: {', '.join(harness_pb2.Resumability.keys())})"
        )
