"""HarnessRegistry over the real wire: register, get (observe), list, retire, and routing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agentsessions.host.journal import canon, open_store
from agentsessions.host.journal.store import JournalStore
from agentsessions.v1 import harness_pb2, harness_registry_pb2, session_pb2
from tests.support.host import HostUnderTest, running_host, text_input
from tests.support.processes import HarnessProcess, harness_process, serve_argv

hr = harness_registry_pb2


@pytest.fixture
async def echo_process() -> AsyncIterator[HarnessProcess]:
    async with harness_process(serve_argv("agentsessions.harnesses.echo:EchoHarness")) as proc:
        yield proc


@pytest.fixture
async def host(store: JournalStore) -> AsyncIterator[HostUnderTest]:
    async with running_host(store) as h:
        yield h


def spec(address: str, descriptor_id: str = "echo") -> hr.HarnessSpec:
    return hr.HarnessSpec(
        remote=hr.RemotePlacement(address=address),
        capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
        descriptor_id=descriptor_id,
    )


def test_spec_digest_matches_the_reference_vector() -> None:
    digest = canon.spec_digest(spec("127.0.0.1:9000"))
    assert digest == "sha256:f0c96c8b67d5dc75be557f64ccd59496eaf9cfb102754ee54e9d4c571eb2eafc"


async def test_register_outcomes_and_routing(host: HostUnderTest, echo_process: HarnessProcess) -> None:
    req = hr.RegisterHarnessRequest(name="mine", spec=spec(echo_process.address))
    first = await host.registry.RegisterHarness(req)
    assert first.outcome == hr.REGISTER_OUTCOME_CREATED
    assert (
        first.harness.state == hr.HARNESS_STATE_ACTIVE
        and first.harness.source == hr.HARNESS_SOURCE_REGISTERED
    )
    assert first.harness.spec_digest == canon.spec_digest(req.spec)
    again = await host.registry.RegisterHarness(req)
    assert again.outcome == hr.REGISTER_OUTCOME_UNCHANGED

    s = await host.sessions.CreateSession(
        session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="mine"))
    )
    updates = [
        u
        async for u in host.sessions.Exec(
            session_pb2.ExecRequest(session=s.metadata.uid, inputs=[text_input("hi")])
        )
    ]
    outputs = [u.record.event.message.parts[0].text.text for u in updates if u.record.event.kind == 3]
    assert outputs == ["echo:hi"]

    # pinned: no override off a registered harness
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.exec(
            session_pb2.ExecRequest(session=s.metadata.uid, inputs=[text_input("x")], harness="echo")
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    observed = await host.registry.GetHarness(hr.GetHarnessRequest(name="mine", observe=True))
    assert observed.observed.id == "echo" and observed.observed.version == "1" and not observed.observe_error

    retired = await host.registry.RetireHarness(hr.RetireHarnessRequest(name="mine", reason="moving"))
    assert retired.state == hr.HARNESS_STATE_RETIRED and retired.retire_reason == "moving"
    again_retired = await host.registry.RetireHarness(hr.RetireHarnessRequest(name="mine", reason="other"))
    assert again_retired.retire_reason == "moving"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.sessions.CreateSession(
            session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="mine"))
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # existing sessions continue on a retired harness
    updates = [
        u
        async for u in host.sessions.Exec(
            session_pb2.ExecRequest(session=s.metadata.uid, inputs=[text_input("more")])
        )
    ]
    assert updates[-1].record.event.kind == 10

    back = await host.registry.RegisterHarness(req)
    assert back.outcome == hr.REGISTER_OUTCOME_REACTIVATED and back.harness.state == hr.HARNESS_STATE_ACTIVE

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.registry.RegisterHarness(hr.RegisterHarnessRequest(name="mine", spec=spec("127.0.0.1:1")))
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_registry_validation(host: HostUnderTest) -> None:
    cases = [
        (
            hr.RegisterHarnessRequest(name="Bad_Name", spec=spec("127.0.0.1:1")),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (hr.RegisterHarnessRequest(name="echo", spec=spec("127.0.0.1:1")), grpc.StatusCode.ALREADY_EXISTS),
        (hr.RegisterHarnessRequest(name="ok", spec=spec("not an address")), grpc.StatusCode.INVALID_ARGUMENT),
        (hr.RegisterHarnessRequest(name="ok", spec=hr.HarnessSpec()), grpc.StatusCode.INVALID_ARGUMENT),
        (
            hr.RegisterHarnessRequest(
                name="ok", spec=hr.HarnessSpec(substrate=hr.SubstratePlacement(template="t"))
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
    ]
    for request, code in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await host.registry.RegisterHarness(request)
        assert err.value.code() == code, request
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.registry.GetHarness(hr.GetHarnessRequest(name="missing"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.registry.RetireHarness(hr.RetireHarnessRequest(name="echo"))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.registry.ListHarnesses(hr.ListHarnessesRequest(page_size=-1))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_what_a_client_may_send_gets_a_precise_status_never_unknown(host: HostUnderTest) -> None:
    """A port of digits that are not ASCII (``str.isdigit`` holds, ``int`` refuses), and names a
    store would refuse (PostgreSQL: NUL in text), answered UNKNOWN or INTERNAL before."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.registry.RegisterHarness(
            hr.RegisterHarnessRequest(name="ok", spec=spec("127.0.0.1:\u00b2"))
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.remote.address" in (err.value.details() or "")
    for name, rule in (
        ("a\x00b", "name: must not contain control characters"),
        ("x" * 254, "name: must be at most 253 characters"),
    ):
        for call in (
            host.registry.GetHarness(hr.GetHarnessRequest(name=name)),
            host.registry.RetireHarness(hr.RetireHarnessRequest(name=name)),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert err.value.details() == rule


async def test_a_failing_store_answers_with_its_status_not_unknown(
    host: HostUnderTest, store: JournalStore
) -> None:
    await store.close()  # every read now fails below the registry
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.registry.GetHarness(hr.GetHarnessRequest(name="missing"))
    assert err.value.code() not in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.NOT_FOUND), err.value


async def test_list_harnesses_in_name_order_with_paging(host: HostUnderTest) -> None:
    for name in ("zeta", "alpha", "mid"):
        await host.registry.RegisterHarness(hr.RegisterHarnessRequest(name=name, spec=spec("127.0.0.1:9")))
    await host.registry.RetireHarness(hr.RetireHarnessRequest(name="mid"))
    names: list[str] = []
    token = ""
    while True:
        page = await host.registry.ListHarnesses(hr.ListHarnessesRequest(page_size=2, page_token=token))
        names.extend(h.metadata.name for h in page.harnesses)
        token = page.next_page_token
        if not token:
            break
    assert names == ["alpha", "chat", "echo", "zeta"]
    everything = await host.registry.ListHarnesses(hr.ListHarnessesRequest(include_retired=True))
    assert [h.metadata.name for h in everything.harnesses] == ["alpha", "chat", "echo", "mid", "zeta"]
    sources = {h.metadata.name: h.source for h in everything.harnesses}
    assert sources["echo"] == hr.HARNESS_SOURCE_STATIC and sources["alpha"] == hr.HARNESS_SOURCE_REGISTERED


async def test_registrations_survive_a_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "j.db")
    store = await open_store(path)
    async with running_host(store) as host:
        await host.registry.RegisterHarness(hr.RegisterHarnessRequest(name="kept", spec=spec("127.0.0.1:9")))
    await store.close()
    store = await open_store(path)
    async with running_host(store) as host:
        got = await host.registry.GetHarness(hr.GetHarnessRequest(name="kept"))
        assert got.spec.remote.address == "127.0.0.1:9"
    await store.close()
