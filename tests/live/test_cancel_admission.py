"""Cancel, keyed Cancel and Submit ON_BUSY_INTERRUPT on a live host while a turn is still being
admitted (its Exec held in the harness's Describe, the session's guard taken, nothing of the turn
journaled yet): that turn ends CANCELED before its harness runs, as a running turn's cancel does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from agentsessions.ext.v1 import live_pb2
from agentsessions.harnesses.echo import EchoHarness
from agentsessions.host.journal.store import JournalStore
from agentsessions.v1 import common_pb2, session_pb2
from tests.lifecycle.held import HeldDescribe, until, wait_for
from tests.lifecycle.streams import BackgroundExec
from tests.live.world import LiveHost, ends, exec_request, inputs_in_order, live_host, submit_request

K = common_pb2.EventKind
LK = common_pb2.Lifecycle


@pytest.fixture
async def held() -> HeldDescribe:
    return HeldDescribe(EchoHarness())


@pytest.fixture
async def host(store: JournalStore, held: HeldDescribe) -> AsyncIterator[LiveHost]:
    async with live_host(store, local={"held": held}) as h:
        yield h


async def in_describe(host: LiveHost, held: HeldDescribe, uid: str) -> BackgroundExec:
    held.hold()
    run = BackgroundExec(host, exec_request(uid, "first"))  # type: ignore[arg-type]
    await wait_for("the Exec's Describe", held.entered)
    return run


async def armed(host: LiveHost, uid: str, pending: asyncio.Task[object]) -> None:
    """Wait until the host took the cancel in (or answered), then let the Describe go."""
    await until("the cancel armed", lambda: pending.done() or host.controller.guards.armed(uid) is not None)


def assert_cut(records: list[common_pb2.LogRecord], reason: str) -> str:
    """The first turn ended CANCELED at once (no harness output) with its CANCEL marker."""
    kinds = [K.Name(r.event.kind) for r in records[:4]]
    assert kinds == ["EVENT_EXECUTION_START", "EVENT_INPUT", "EVENT_END", "EVENT_LIFECYCLE"]
    end, marker = records[2].event, records[3].event
    assert end.end.state == "CANCELED" and reason in end.end.error.description
    assert marker.lifecycle.kind == LK.LIFECYCLE_CANCEL and reason in marker.lifecycle.detail
    return records[0].event.execution_id


async def test_cancel_during_admission_on_a_live_host(host: LiveHost, held: HeldDescribe) -> None:
    uid = await host.create("held")
    run = await in_describe(host, held, uid)
    pending = asyncio.create_task(host.client.cancel(uid, reason="stop it"))
    await armed(host, uid, pending)
    held.release()
    session = await pending
    assert session.exec_state == session_pb2.EXEC_CANCELED
    code, _ = await run.outcome()
    assert code == grpc.StatusCode.CANCELLED
    records = await host.records(uid)
    assert_cut(records, "stop it")
    assert len(records) == 4 and held.runs == 0


async def test_a_keyed_cancel_during_admission_cancels_that_turn_once(
    host: LiveHost, held: HeldDescribe
) -> None:
    uid = await host.create("held")
    run = await in_describe(host, held, uid)
    pending = asyncio.create_task(host.client.cancel(uid, reason="stop", idempotency_key="k"))
    await armed(host, uid, pending)
    held.release()
    await pending
    assert (await run.outcome())[0] == grpc.StatusCode.CANCELLED
    cut = assert_cut(await host.records(uid), "stop")
    # A later turn, then the retried key: it cancels only what the first one did (never this turn).
    later = await host.live.Submit(submit_request(uid, "later"))
    assert later.execution_id != cut
    retried = await host.client.cancel(uid, reason="stop", idempotency_key="k")
    records = await host.wait_for(uid, lambda rs: len(ends(rs)) == 2, "the later turn's END")
    assert [r.event.end.state for r in ends(records)] == ["CANCELED", "COMPLETED"]
    assert retried.metadata.uid == uid


async def test_interrupt_during_admission_cancels_the_admitted_turn_then_runs(
    host: LiveHost, held: HeldDescribe
) -> None:
    uid = await host.create("held")
    run = await in_describe(host, held, uid)

    async def interrupt() -> live_pb2.SubmitResponse:
        response: live_pb2.SubmitResponse = await host.live.Submit(
            submit_request(uid, "now", live_pb2.ON_BUSY_INTERRUPT)
        )
        return response

    pending = asyncio.create_task(interrupt())
    await armed(host, uid, pending)
    held.release()
    second = await pending
    assert (await run.outcome())[0] == grpc.StatusCode.CANCELLED
    records = await host.wait_for(uid, lambda rs: len(ends(rs)) == 2, "both ENDs")
    first = assert_cut(records, "interrupted by a newer turn (Submit ON_BUSY_INTERRUPT)")
    assert first != second.execution_id
    assert records[4].event.kind == K.EVENT_EXECUTION_START
    assert records[4].event.execution_id == second.execution_id
    assert records[-1].event.end.state == "COMPLETED"
    assert inputs_in_order(records) == ["first", "now"]
    assert held.runs == 1  # only the new turn ran its harness
