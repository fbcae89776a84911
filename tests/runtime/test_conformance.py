"""One suite over the three runtimes (in-process, host-started subprocess, remote address): the
Runtime protocol's behaviour and the honest capabilities each reports."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from agentsessions.harnesses.counter import CounterHarness
from agentsessions.harnesses.echo import EchoHarness
from agentsessions.host.runtime import (
    InProcessRuntime,
    ProcessRuntime,
    RemoteRuntime,
    Runtime,
    RuntimeCapabilities,
    SnapshotRef,
    placement_refusal,
)
from agentsessions.sdk.testing import HarnessEnvironment
from agentsessions.v1 import common_pb2, harness_pb2, session_pb2
from tests.runtime.harnesses import GpuHarness
from tests.runtime.hosting import REPO
from tests.support.processes import harness_process, serve_argv

ECHO = "agentsessions.harnesses.echo:EchoHarness"
RUNTIMES = ["in-process", "subprocess", "remote"]

# One runtime (and harness process) per kind for the whole module; each test uses fresh session uids.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@dataclass
class Placed:
    runtime: Runtime
    kind: str


@contextlib.asynccontextmanager
async def placed_echo(kind: str) -> AsyncIterator[Placed]:
    if kind == "in-process":
        runtime: Runtime = InProcessRuntime(EchoHarness())
        await runtime.start()
        try:
            yield Placed(runtime, kind)
        finally:
            await runtime.close()
    elif kind == "subprocess":
        runtime = ProcessRuntime("conformance", ECHO, cwd=str(REPO))
        await runtime.start()
        try:
            yield Placed(runtime, kind)
        finally:
            await runtime.close()
    else:
        async with harness_process(serve_argv(ECHO)) as served:
            runtime = RemoteRuntime(served.address)
            await runtime.start()
            try:
                yield Placed(runtime, kind)
            finally:
                await runtime.close()


@pytest_asyncio.fixture(params=RUNTIMES, scope="module", loop_scope="module")
async def placed(request: pytest.FixtureRequest) -> AsyncIterator[Placed]:
    async with placed_echo(request.param) as p:
        yield p


def uid() -> str:
    return "sess-" + secrets.token_hex(12)


def descriptor(**capabilities: object) -> harness_pb2.HarnessDescriptor:
    desc = harness_pb2.HarnessDescriptor(id="h", version="1")
    for name, value in capabilities.items():
        setattr(desc.capabilities, name, value)
    return desc


async def test_each_runtime_is_a_runtime_and_names_its_kind(placed: Placed) -> None:
    assert isinstance(placed.runtime, Runtime)
    assert placed.runtime.name == placed.kind


async def test_the_placed_harness_describes_itself_and_runs_a_turn(placed: Placed) -> None:
    desc = await placed.runtime.harness.describe()
    assert desc.id == "echo"
    env = HarnessEnvironment(placed.runtime.harness, model=lambda call: "echo:" + call.messages[-1].text())
    outcome = await env.run("hi")
    assert [m.text() for call in env.requests for m in call.messages] == ["hi"]
    assert (outcome.state, outcome.outputs) == ("COMPLETED", ["echo:hi"])


async def test_capabilities_are_honest_no_runtime_snapshots_memory(placed: Placed) -> None:
    caps = placed.runtime.capabilities()
    assert caps == RuntimeCapabilities(memory_snapshot=False, cow_fork=False, attest=False, gpu_state=False)
    assert caps.to_proto() == session_pb2.RuntimeCapabilities()


async def test_create_attaches_a_session(placed: Placed) -> None:
    runtime, a = placed.runtime, uid()
    assert await runtime.status(a) == session_pb2.COMPUTE_NONE
    incarnation = await runtime.create(a)
    assert (incarnation.session, incarnation.runtime) == (a, placed.kind)
    assert incarnation.address
    assert await runtime.status(a) == session_pb2.COMPUTE_LIVE


async def test_snapshot_names_the_session_and_holds_no_memory(placed: Placed) -> None:
    runtime, a = placed.runtime, uid()
    await runtime.create(a)
    ref = await runtime.snapshot(a)
    assert ref == SnapshotRef(local=a, external_uri="", memory=False, sealed=False)
    assert await runtime.status(a) == session_pb2.COMPUTE_COLD
    marker = ref.suspend_marker()
    assert marker.kind == common_pb2.Lifecycle.LIFECYCLE_SUSPEND
    assert (marker.snapshot_local, marker.snapshot_memory) == (a, False)


async def test_restore_and_fork_attach_from_a_snapshot(placed: Placed) -> None:
    runtime, a, b = placed.runtime, uid(), uid()
    await runtime.create(a)
    ref = await runtime.snapshot(a)
    restored = await runtime.restore(ref)
    child = await runtime.fork(ref, b)
    assert (restored.session, child.session) == (a, b)
    assert await runtime.status(a) == session_pb2.COMPUTE_LIVE
    assert await runtime.status(b) == session_pb2.COMPUTE_LIVE


async def test_stop_releases_the_session(placed: Placed) -> None:
    runtime, a = placed.runtime, uid()
    await runtime.create(a)
    await runtime.stop(a)
    assert await runtime.status(a) == session_pb2.COMPUTE_TERMINATED


@pytest.mark.parametrize(
    "call",
    [
        "create-empty",
        "snapshot-empty",
        "restore-unnamed",
        "restore-memory",
        "fork-no-child",
        "stop-empty",
    ],
)
async def test_malformed_requests_are_refused(placed: Placed, call: str) -> None:
    runtime = placed.runtime
    with pytest.raises(ValueError):
        if call == "create-empty":
            await runtime.create("")
        elif call == "snapshot-empty":
            await runtime.snapshot("")
        elif call == "restore-unnamed":
            await runtime.restore(SnapshotRef())
        elif call == "restore-memory":
            # A memory snapshot can only come from a runtime that takes them; none of these does.
            await runtime.restore(SnapshotRef(local="sess-a", memory=True))
        elif call == "fork-no-child":
            await runtime.fork(SnapshotRef(local="sess-a"), "")
        else:
            await runtime.stop("")


async def test_a_memory_snapshot_harness_is_refused_with_why_and_what_to_do(placed: Placed) -> None:
    counter = await CounterHarness().describe()
    refusal = placement_refusal(placed.runtime, "counter", counter)
    assert refusal is not None
    assert "'counter'" in refusal
    assert "RESUMABILITY_REQUIRES_MEMORY_SNAPSHOT" in refusal
    assert f"({placed.kind})" in refusal
    assert placed.runtime.memory_loss in refusal
    assert "STATELESS_REPLAY" in refusal and "docs/runtimes.md" in refusal


async def test_a_gpu_harness_is_refused(placed: Placed) -> None:
    refusal = placement_refusal(placed.runtime, "gpu", await GpuHarness().describe())
    assert refusal is not None
    assert "requires a GPU" in refusal and f"({placed.kind})" in refusal


@pytest.mark.parametrize(
    "resumability",
    [harness_pb2.RESUMABILITY_STATELESS_REPLAY, harness_pb2.RESUMABILITY_UNSPECIFIED],
)
async def test_a_stateless_harness_is_placed(placed: Placed, resumability: int) -> None:
    assert placement_refusal(placed.runtime, "h", descriptor(resumability=resumability)) is None
