"""Idempotent admission: the same idempotency-key with the same request does the work once (Exec,
Submit, Fork, CreateSession, Approve, Cancel); with a different request it answers
ALREADY_EXISTS naming the key; keys expire after the retention."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from agentsessions.ext.v1 import live_pb2
from agentsessions.host.journal.store import JournalStore
from agentsessions.v1 import common_pb2, session_pb2
from tests.approvals.harnesses import ToolHarness
from tests.live.world import (
    TEST_SETTINGS,
    CountingModel,
    LiveHost,
    ends,
    exec_request,
    inputs_in_order,
    live_host,
    submit_request,
)

K = common_pb2.EventKind


@pytest.fixture
def model() -> CountingModel:
    return CountingModel()


@pytest.fixture
async def host(store: JournalStore, model: CountingModel) -> AsyncIterator[LiveHost]:
    async with live_host(store, model=model, local={"tooler": ToolHarness()}) as h:
        yield h


def keyed(key: str) -> tuple[tuple[str, str]]:
    return (("idempotency-key", key),)


async def exec_updates(
    host: LiveHost, request: session_pb2.ExecRequest, key: str
) -> list[session_pb2.ExecUpdate]:
    return [u async for u in host.sessions.Exec(request, metadata=keyed(key))]


def records_of(updates: list[session_pb2.ExecUpdate]) -> list[common_pb2.LogRecord]:
    return [u.record for u in updates if u.WhichOneof("update") == "record"]


async def test_a_retried_exec_streams_the_same_execution_and_the_model_runs_once(
    host: LiveHost, model: CountingModel
) -> None:
    uid = await host.create("echo")
    first = await exec_updates(host, exec_request(uid, "hi"), "turn-1")
    again = await exec_updates(host, exec_request(uid, "hi"), "turn-1")
    assert records_of(again) == records_of(first) == await host.records(uid)
    assert again[0].WhichOneof("update") == "session"
    assert model.calls == 1
    # The deadline is a per-attempt bound, not part of the request.
    later = exec_request(uid, "hi", deadline_unix=4_000_000_000)
    assert records_of(await exec_updates(host, later, "turn-1")) == records_of(first)


async def test_a_retry_of_a_running_exec_streams_it_live_from_its_first_record(host: LiveHost) -> None:
    uid = await host.create()
    original = host.sessions.Exec(exec_request(uid, "slow"), metadata=keyed("k"))
    assert (await original.read()).WhichOneof("update") == "session"
    assert await host.harness.next_started() == "slow"
    retry = host.sessions.Exec(exec_request(uid, "slow"), metadata=keyed("k"))
    assert (await retry.read()).WhichOneof("update") == "session"
    start = await retry.read()
    assert start.record.event.kind == K.EVENT_EXECUTION_START
    host.harness.open("slow")
    rest: list[session_pb2.ExecUpdate] = [start]
    while (update := await retry.read()) != grpc.aio.EOF:
        rest.append(update)
    others: list[session_pb2.ExecUpdate] = []
    while (update := await original.read()) != grpc.aio.EOF:
        others.append(update)
    assert records_of(rest) == records_of(others) == await host.records(uid)
    assert "".join(u.delta.chunk for u in rest if u.WhichOneof("update") == "delta") == "echo:slow"
    assert host.harness.runs == ["slow"]


async def test_the_same_key_with_another_request_is_already_exists(host: LiveHost) -> None:
    uid = await host.create("echo")
    await exec_updates(host, exec_request(uid, "hi"), "once")
    for request in (exec_request(uid, "other"), exec_request(uid, "hi", harness="gated")):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await exec_updates(host, request, "once")
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert "idempotency-key 'once'" in (err.value.details() or "")
    # Another method with the key is another request.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.sessions.Fork(session_pb2.ForkRequest(session=uid), metadata=keyed("once"))
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert len(ends(await host.records(uid))) == 1


async def test_a_key_longer_than_the_limit_is_refused_before_anything_runs(host: LiveHost) -> None:
    uid = await host.create("echo")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await exec_updates(host, exec_request(uid, "hi"), "x" * 300)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "idempotency-key metadata" in (err.value.details() or "")
    assert await host.records(uid) == []


async def test_a_retried_exec_without_a_session_finds_the_same_session(host: LiveHost) -> None:
    request = session_pb2.ExecRequest(harness="echo", inputs=exec_request("", "new").inputs)
    first = await exec_updates(host, request, "fresh")
    again = await exec_updates(host, request, "fresh")
    uid = first[0].session.metadata.uid
    assert again[0].session.metadata.uid == uid
    assert records_of(again) == records_of(first)
    listed = [s.metadata.uid async for s in host.client.list_sessions()]
    assert listed == [uid]


async def test_a_retried_submit_admits_once(host: LiveHost) -> None:
    uid = await host.create("echo")
    first = await host.live.Submit(submit_request(uid, "go"), metadata=keyed("s"))
    again = await host.live.Submit(submit_request(uid, "go"), metadata=keyed("s"))
    assert (again.execution_id, again.start_seq) == (first.execution_id, first.start_seq)
    records = await host.wait_for(uid, lambda rs: bool(ends(rs)), "the END")
    assert inputs_in_order(records) == ["go"]


async def test_a_retried_queued_submit_stays_one_queued_turn(host: LiveHost) -> None:
    uid = await host.create()
    await host.live.Submit(submit_request(uid, "a"))
    assert await host.harness.next_started() == "a"
    queued = await host.live.Submit(submit_request(uid, "b", live_pb2.ON_BUSY_ENQUEUE), metadata=keyed("q"))
    again = await host.live.Submit(submit_request(uid, "b", live_pb2.ON_BUSY_ENQUEUE), metadata=keyed("q"))
    assert queued.queued and again.queued
    assert again.queued_execution_id == queued.queued_execution_id
    host.harness.open("a")
    host.harness.open("b")
    records = await host.wait_for(uid, lambda rs: len(ends(rs)) == 2, "both ENDs")
    assert inputs_in_order(records) == ["a", "b"]
    started = await host.live.Submit(submit_request(uid, "b", live_pb2.ON_BUSY_ENQUEUE), metadata=keyed("q"))
    assert not started.queued and started.execution_id == queued.queued_execution_id
    assert started.start_seq == next(r.seq for r in records if r.event.execution_id == started.execution_id)


async def test_a_retried_fork_returns_the_same_children(host: LiveHost) -> None:
    uid = await host.create("echo")
    await exec_updates(host, exec_request(uid, "hi"), "t")
    request = session_pb2.ForkRequest(session=uid, count=2, child_names=["l", "r"])
    first = await host.sessions.Fork(request, metadata=keyed("f"))
    again = await host.sessions.Fork(request, metadata=keyed("f"))
    assert [c.metadata.uid for c in again.children] == [c.metadata.uid for c in first.children]
    assert len([s async for s in host.client.list_sessions()]) == 3


async def test_a_retried_create_session_returns_the_same_session(host: LiveHost) -> None:
    first = await host.client.create_session(harness="echo", name="once", idempotency_key="c")
    again = await host.client.create_session(harness="echo", name="once", idempotency_key="c")
    assert again.metadata.uid == first.metadata.uid
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.client.create_session(harness="echo", name="twice", idempotency_key="c")
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert len([s async for s in host.client.list_sessions()]) == 1


async def test_a_retried_approve_decides_once(host: LiveHost, store: JournalStore) -> None:
    uid = await host.create("tooler")
    parked = await exec_updates(
        host, session_pb2.ExecRequest(session=uid, inputs=exec_request(uid, "x").inputs), "p"
    )
    ref = parked[-1].session.pending_approval
    assert ref.request_seq > 0
    first = await host.client.approve(ref, uid, approved=False, reason="no", idempotency_key="a")
    again = await host.client.approve(ref, uid, approved=False, reason="no", idempotency_key="a")
    assert again.decision == first.decision
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.client.approve(ref, uid, approved=False, reason="changed my mind", idempotency_key="a")
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    decisions = [r for r in await host.records(uid) if r.event.kind == K.EVENT_APPROVAL_RESULT]
    assert [d.seq for d in decisions] == [first.decision.seq]
    # Decided: the host recovers the parked turn by itself (the denial is its receipt).
    records = await host.wait_for(uid, lambda rs: bool(ends(rs)), "the parked turn's END")
    assert ends(records)[0].event.end.state == "COMPLETED"


async def test_a_retried_cancel_does_not_cancel_a_later_turn(host: LiveHost) -> None:
    uid = await host.create()
    await host.live.Submit(submit_request(uid, "first"))
    assert await host.harness.next_started() == "first"
    await host.client.cancel(uid, reason="stop", idempotency_key="c")
    records = await host.wait_for(uid, lambda rs: bool(ends(rs)), "the cancelled END")
    assert ends(records)[0].event.end.state == "CANCELED"
    await host.live.Submit(submit_request(uid, "second"))
    assert await host.harness.next_started() == "second"
    await host.client.cancel(uid, reason="stop", idempotency_key="c")  # the retry
    host.harness.open("second")
    records = await host.wait_for(uid, lambda rs: len(ends(rs)) == 2, "the second END")
    assert [e.event.end.state for e in ends(records)] == ["CANCELED", "COMPLETED"]


async def test_keys_expire_after_the_retention(store: JournalStore, model: CountingModel) -> None:
    settings = dataclasses.replace(TEST_SETTINGS, key_retention_s=1e-6)
    async with live_host(store, settings=settings, model=model) as host:
        uid = await host.create("echo")
        await exec_updates(host, exec_request(uid, "hi"), "short")
        await exec_updates(host, exec_request(uid, "hi"), "short")
        assert len(ends(await host.records(uid))) == 2
        assert model.calls == 2


async def test_a_retry_runs_the_turn_its_earlier_attempt_reserved_once_the_session_is_free(
    host: LiveHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An attempt that reserved its key but ended before its turn started (refused, or its host
    # killed) leaves the key reserved; a retry that meets the session busy with another turn waits
    # for it to end, then runs the reserved turn (was: waited for an original that never came,
    # then ABORTED; bench.chaos saw it after kills).
    live = host.controller.live
    assert live is not None
    following = asyncio.Event()
    follow = live.follow_original

    async def observed(*args: Any, **kwargs: Any) -> Any:
        following.set()
        return await follow(*args, **kwargs)

    monkeypatch.setattr(live, "follow_original", observed)
    uid = await host.create()
    host.harness.open("next")
    busy = host.sessions.Exec(exec_request(uid, "slow"))
    assert (await busy.read()).WhichOneof("update") == "session"
    assert await host.harness.next_started() == "slow"
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await exec_updates(host, exec_request(uid, "next"), "k")
    assert refused.value.code() == grpc.StatusCode.ABORTED  # its own key: refused at once, as v1
    assert not following.is_set()
    retry = asyncio.create_task(exec_updates(host, exec_request(uid, "next"), "k"))
    async with asyncio.timeout(30):
        await following.wait()
    host.harness.open("slow")
    while await busy.read() != grpc.aio.EOF:
        pass
    async with asyncio.timeout(30):
        updates = await retry
    ended = [r.event.end.state for r in records_of(updates) if r.event.kind == K.EVENT_END]
    assert ended == ["COMPLETED"]
    assert host.harness.runs == ["slow", "next"]
    again = await exec_updates(host, exec_request(uid, "next"), "k")
    assert records_of(again) == records_of(updates)
