"""Structured results over real gRPC: a turn bound to a JSON Schema (Submit's ``result_schema``,
Exec's ``agentsessions-result-schema`` metadata) settles with the validated JSON as a data part,
after corrective turns the harness sees as ordinary inputs, or ends FAILED with
``result_schema_invalid``; the chat harness talks to a scripted chat-completions endpoint on
loopback, so every model call is counted where it arrives."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from grpc import aio

from agentsessions.client import SessionsClient
from agentsessions.ext.v1 import live_pb2, live_pb2_grpc
from agentsessions.harnesses.chat import ChatHarness
from agentsessions.host.controller import results
from agentsessions.host.controller.controller import Controller
from agentsessions.host.controller.harnesses import HarnessCatalog, StaticHarness
from agentsessions.host.harnesslink import RemoteHarness
from agentsessions.host.idempotency import IdempotencyInterceptor
from agentsessions.host.journal.sqlite import SqliteStore
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.models.openai import OpenAIModel
from agentsessions.host.service.live import LiveSessionsServicer
from agentsessions.host.service.result_schema import ResultSchemaInterceptor
from agentsessions.host.service.sessions import SessionsServicer
from agentsessions.sdk import Execution, text_message
from agentsessions.sdk.extensions import RESULTS_PRINCIPAL
from agentsessions.v1 import common_pb2, session_pb2, session_pb2_grpc
from tests.live.world import TEST_SETTINGS, WAIT_S
from tests.support.scripted_endpoint import Reply, ScriptedEndpoint, scripted_endpoint

K = common_pb2.EventKind

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
VALID = '{"city": "Lyon", "population": 522000}'


class FailsAfterItsModelCallOnce(ChatHarness):
    """The chat harness, but its first run fails right after its model call: the turn is left for
    automatic recovery, which re-runs it against the recorded completion."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    async def execute(self, ex: Execution) -> None:
        await super().execute(ex)
        if not self.failed:
            self.failed = True
            raise RuntimeError("the harness process died after its model call")


@dataclass
class Host:
    controller: Controller
    store: JournalStore
    sessions: session_pb2_grpc.SessionsStub
    live: live_pb2_grpc.LiveSessionsStub
    client: SessionsClient

    async def records(self, uid: str) -> list[common_pb2.LogRecord]:
        return list(await self.store.read(uid))

    async def settled(self, uid: str) -> list[common_pb2.LogRecord]:
        """Follow the session until a turn ends and no corrective turn follows it."""
        seen = await self.records(uid)
        if _settled(seen):
            return seen
        with contextlib.suppress(TimeoutError):
            async with _timeout():
                async for update in self.client.watch(uid, after_seq=seen[-1].seq if seen else 0):
                    if update.HasField("record"):
                        seen.append(update.record)
                        if _settled(seen):
                            return seen
        raise AssertionError(f"session {uid} did not settle: {[r.event.kind for r in seen]}")


def _timeout() -> Any:
    return asyncio.timeout(WAIT_S)


def _settled(records: list[common_pb2.LogRecord]) -> bool:
    """A schema-bound turn ended FAILED, or with the host's settled OUTPUT right before its END."""
    if len(records) < 2 or records[-1].event.kind != K.EVENT_END:
        return False
    return records[-1].event.end.state == "FAILED" or records[-2].event.actor.principal == RESULTS_PRINCIPAL


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with scripted_endpoint() as served:
        yield served


@pytest.fixture
async def host(tmp_path: Path, endpoint: ScriptedEndpoint) -> AsyncIterator[Host]:
    store = await SqliteStore.open(tmp_path / "journal.db")
    static = {
        "chat": StaticHarness(ChatHarness()),
        "flaky": StaticHarness(FailsAfterItsModelCallOnce()),
    }
    catalog = HarnessCatalog(static, store, RemoteHarness, default="chat")
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url, stream=False)
    controller = Controller(store, catalog, model, live=TEST_SETTINGS)
    assert controller.live is not None
    await controller.live.start()
    server = aio.server(interceptors=[IdempotencyInterceptor(), ResultSchemaInterceptor()])
    session_pb2_grpc.add_SessionsServicer_to_server(SessionsServicer(controller), server)
    live_pb2_grpc.add_LiveSessionsServicer_to_server(LiveSessionsServicer(controller), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield Host(
            controller,
            store,
            session_pb2_grpc.SessionsStub(channel),
            live_pb2_grpc.LiveSessionsStub(channel),
            SessionsClient(channel),
        )
    finally:
        await channel.close()
        await server.stop(None)
        await controller.live.close(1.0)
        await store.close()


def struct(value: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


def submit(uid: str, text: str, schema: dict[str, Any], **fields: Any) -> live_pb2.SubmitRequest:
    exec_request = session_pb2.ExecRequest(session=uid, inputs=[text_message("user", text)])
    return live_pb2.SubmitRequest(exec=exec_request, result_schema=struct(schema), **fields)


def host_inputs(records: list[common_pb2.LogRecord]) -> list[common_pb2.LogRecord]:
    return [
        r for r in records if r.event.kind == K.EVENT_INPUT and r.event.actor.principal == RESULTS_PRINCIPAL
    ]


def sent_messages(endpoint: ScriptedEndpoint, n: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = endpoint.received[n].body["messages"]
    return messages


async def new_session(host: Host, harness: str = "chat") -> str:
    return (await host.client.create_session(harness=harness)).metadata.uid


async def test_a_submitted_turn_that_answers_invalid_json_settles_valid_after_one_correction(
    host: Host, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(Reply.completion("The city is Lyon."), Reply.completion(f"```json\n{VALID}\n```"))
    uid = await new_session(host)
    response = await host.live.Submit(submit(uid, "Which city?", SCHEMA))
    records = await host.settled(uid)

    kinds = [r.event.kind for r in records]
    start, inp, call, out, end = (
        K.EVENT_EXECUTION_START, K.EVENT_INPUT, K.EVENT_MODEL_CALL, K.EVENT_OUTPUT, K.EVENT_END,
    )  # fmt: skip
    assert kinds == [start, inp, inp, call, out, end, start, inp, call, out, out, end]
    first, second = records[0].event.execution_id, records[6].event.execution_id
    assert first == response.execution_id and second != first
    assert records[0].event.execution_start.input_count == 2
    assert records[6].event.execution_start.input_count == 1
    assert records[5].event.end.state == "COMPLETED"
    # The schema is journaled with each turn, as the host's last input (attempt 0 of 2, then 1 of 2).
    bound, correction = host_inputs(records)
    assert bound.event.actor.subject == "attempt:0/2" and correction.event.actor.subject == "attempt:1/2"
    assert json.loads(bound.event.message.parts[0].text.text.rsplit("\n", 1)[1]) == SCHEMA
    correction_text = correction.event.message.parts[0].text.text
    assert "did not satisfy the result schema: the final output is not JSON" in correction_text
    # The settled result: the validated JSON as a data part in the final OUTPUT, then END COMPLETED.
    settled = records[10].event
    assert settled.actor.principal == RESULTS_PRINCIPAL
    assert settled.message.parts[0].WhichOneof("part") == "data"
    assert dict(settled.message.parts[0].data.data) == {"city": "Lyon", "population": 522000}
    assert records[11].event.end.state == "COMPLETED"
    session = await host.client.get_session(uid)
    assert session.exec_state == session_pb2.EXEC_COMPLETED
    # Two model calls; the second saw the first answer and the correction as ordinary messages.
    assert len(endpoint.received) == 2
    second_messages = sent_messages(endpoint, 1)
    assert second_messages[-2] == {"role": "assistant", "content": "The city is Lyon."}
    assert second_messages[-1]["role"] == "user" and "not JSON" in second_messages[-1]["content"]
    # Replay re-runs both turns from the journal: zero model calls, the chain verifies.
    report = await host.controller.replay(uid)
    assert report.executions == 2 and report.model_calls == 0 and report.served_model_calls == 2
    assert len(endpoint.received) == 2
    assert await host.store.verify(uid) == len(records)


async def test_an_exec_that_never_validates_ends_failed_with_the_validation_error(
    host: Host, endpoint: ScriptedEndpoint
) -> None:
    wrong = '{"city": "Lyon", "population": "many"}'
    endpoint.script(*(Reply.completion(wrong) for _ in range(3)))
    uid = await new_session(host)
    request = session_pb2.ExecRequest(session=uid, inputs=[text_message("user", "Which city?")])
    metadata = ((results.METADATA_KEY, json.dumps(SCHEMA)),)
    updates = [u async for u in host.sessions.Exec(request, metadata=metadata)]
    streamed = [u.record for u in updates if u.HasField("record")]
    records = await host.records(uid)
    assert [r.seq for r in streamed] == [r.seq for r in records]  # the Exec stream carried all turns
    ends = [r.event for r in records if r.event.kind == K.EVENT_END]
    assert [e.end.state for e in ends] == ["COMPLETED", "COMPLETED", "FAILED"]
    failure = ends[-1].end.error.description
    assert failure.startswith("result_schema_invalid: at['population']: 'many' is not of type 'integer'")
    assert "after 2 corrective turn(s)" in failure
    assert len(endpoint.received) == 3  # the turn and two corrections, no more
    subjects = [r.event.actor.subject for r in host_inputs(records)]
    assert subjects == ["attempt:0/2", "attempt:1/2", "attempt:2/2"]
    outputs = [r for r in records if r.event.kind == K.EVENT_OUTPUT]
    assert not any(r.event.actor.principal == RESULTS_PRINCIPAL for r in outputs)
    session = await host.client.get_session(uid)
    assert session.exec_state == session_pb2.EXEC_FAILED
    report = await host.controller.replay(uid)
    assert report.executions == 3 and report.model_calls == 0


async def test_a_recovered_schema_bound_turn_settles_the_same_way_without_a_second_model_call(
    host: Host, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(Reply.completion(VALID))
    uid = await new_session(host, "flaky")
    await host.live.Submit(submit(uid, "Which city?", SCHEMA))
    records = await host.settled(uid)
    kinds = [r.event.kind for r in records]
    # The first attempt failed after its model call (ERROR); recovery served the recorded completion,
    # then settled the result from the journal exactly as the live run would have.
    assert K.EVENT_ERROR in kinds
    assert kinds[-2:] == [K.EVENT_OUTPUT, K.EVENT_END]
    assert records[-2].event.actor.principal == RESULTS_PRINCIPAL
    assert dict(records[-2].event.message.parts[0].data.data) == {"city": "Lyon", "population": 522000}
    assert len(endpoint.received) == 1


async def test_a_later_turn_sees_the_answer_once_and_not_the_settled_data(
    host: Host, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(Reply.completion(VALID), Reply.completion("Nice city."))
    uid = await new_session(host)
    await host.live.Submit(submit(uid, "Which city?", SCHEMA))
    await host.settled(uid)
    request = session_pb2.ExecRequest(session=uid, inputs=[text_message("user", "Tell me more")])
    [u async for u in host.sessions.Exec(request)]
    later = sent_messages(endpoint, 1)
    assert [m["role"] for m in later] == ["user", "user", "assistant", "user"]
    assert later[2]["content"] == VALID


@pytest.mark.parametrize(
    ("schema", "rule"),
    [
        ({"type": "objekt"}, "result_schema: is not a valid JSON Schema: at['type']"),
        ({"properties": {"a": {"minLength": -1}}}, "result_schema: is not a valid JSON Schema: at['prop"),
        ({"required": "city"}, "result_schema: is not a valid JSON Schema: at['required']"),
    ],
)
async def test_an_invalid_schema_is_refused_before_anything_is_written(
    host: Host, endpoint: ScriptedEndpoint, schema: dict[str, Any], rule: str
) -> None:
    uid = await new_session(host)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await host.live.Submit(submit(uid, "Which city?", schema))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert rule in (refused.value.details() or "")
    metadata = ((results.METADATA_KEY, json.dumps(schema)),)
    request = session_pb2.ExecRequest(session=uid, inputs=[text_message("user", "Which city?")])
    with pytest.raises(grpc.aio.AioRpcError) as refused_exec:
        [u async for u in host.sessions.Exec(request, metadata=metadata)]
    assert refused_exec.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = refused_exec.value.details() or ""
    assert details.startswith(f"{results.METADATA_KEY} metadata: is not a valid JSON Schema")
    assert await host.records(uid) == [] and endpoint.received == []


@pytest.mark.parametrize(
    ("metadata", "rule"),
    [
        ("{not json", "agentsessions-result-schema metadata: is not JSON"),
        ("[1, 2]", "agentsessions-result-schema metadata: must be a JSON object (a JSON Schema), got an"),
    ],
)
async def test_exec_metadata_that_is_no_schema_is_refused(
    host: Host, endpoint: ScriptedEndpoint, metadata: str, rule: str
) -> None:
    uid = await new_session(host)
    request = session_pb2.ExecRequest(session=uid, inputs=[text_message("user", "Which city?")])
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        [u async for u in host.sessions.Exec(request, metadata=((results.METADATA_KEY, metadata),))]
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (refused.value.details() or "").startswith(rule)
    assert await host.records(uid) == []


async def test_a_schema_cannot_ride_a_queued_turn(host: Host) -> None:
    uid = await new_session(host)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await host.live.Submit(submit(uid, "Which city?", SCHEMA, on_busy=live_pb2.ON_BUSY_ENQUEUE))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (refused.value.details() or "").startswith("result_schema: cannot be combined with on_busy")


def test_a_corrective_input_says_what_failed_within_a_bound() -> None:
    binding = results.Binding(SCHEMA, 1, 2)
    text = "".join(
        p.text.text for p in results.schema_input("e", binding, "at the root: " + "x" * 100_000).message.parts
    )
    first = text.splitlines()[0]
    assert first.startswith("Your previous answer did not satisfy the result schema: at the root: xxx")
    assert first.endswith("...") and len(first) < results.MAX_FAILED_CHARS + 100
    assert results.binding_of([results.schema_input("e", binding, "x" * 100_000)]) == binding


def test_validate_result_names_the_path_and_the_rule() -> None:
    assert results.validate_result({"city": "Lyon", "population": 1}, SCHEMA) is None
    missing = results.validate_result({"city": "Lyon"}, SCHEMA)
    assert missing == "at the root: 'population' is a required property"
    nested = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "integer"}}}}
    wrong = results.validate_result({"items": [1, "x"]}, nested)
    assert wrong == "at['items'][1]: 'x' is not of type 'integer'"


async def test_a_retried_keyed_exec_streams_the_corrective_turns_too(
    host: Host, endpoint: ScriptedEndpoint
) -> None:
    """A keyed Exec retried after its schema-bound turn settled streams what the first call did:
    the turn and its corrective turns, to the last END (not only the execution it admitted)."""
    endpoint.script(Reply.completion("The city is Lyon."), Reply.completion(VALID))
    uid = await new_session(host)
    request = session_pb2.ExecRequest(session=uid, inputs=[text_message("user", "Which city?")])
    metadata = ((results.METADATA_KEY, json.dumps(SCHEMA)), ("idempotency-key", "city-1"))
    first = [
        u.record
        for u in [u async for u in host.sessions.Exec(request, metadata=metadata)]
        if u.HasField("record")
    ]
    again = [
        u.record
        for u in [u async for u in host.sessions.Exec(request, metadata=metadata)]
        if u.HasField("record")
    ]
    records = await host.records(uid)
    assert [r.event.end.state for r in records if r.event.kind == K.EVENT_END] == ["COMPLETED", "COMPLETED"]
    assert first == records
    assert again == first
    assert len(endpoint.received) == 2  # the retry ran nothing
