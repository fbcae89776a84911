"""ToolRegistry: routing, durable dedup on (session, idempotency key), failure receipts.

The dedup tests run against a dict-backed receipt store implementing only the two receipt
methods of the JournalStore protocol, and against the journal's own stores (memory, and SQLite
closed and reopened between the two host lifetimes).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import struct_pb2

from agentsessions.host.tools import (
    CallableTool,
    DuplicateToolError,
    MissingIdempotencyKeyError,
    MissingToolExecutorError,
    PythonCallableExecutor,
    ToolContext,
    ToolReceiptStore,
    ToolRegistry,
    UnmediatedToolCallError,
)
from agentsessions.v1 import common_pb2
from tests.tools.receipts import DictReceiptStore

SESSION = "sess-000000000000000000000001"

# Effects the tool functions below perform, in order; cleared before every test.
EFFECTS: list[tuple[str, Any]] = []
CALLER_THREADS: list[int] = []


@pytest.fixture(autouse=True)
def _clear_effects() -> None:
    EFFECTS.clear()
    CALLER_THREADS.clear()


def append_line(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    """Append a line to the effect log (sync: runs in a worker thread)."""
    CALLER_THREADS.append(threading.get_ident())
    EFFECTS.append(("append_line", args["line"]))
    return {"lines": len(EFFECTS), "key": context.idempotency_key, "session": context.session_uid}


async def async_note(args: dict[str, Any], context: ToolContext) -> common_pb2.ToolResult:
    """Record a note and answer with an explicit ToolResult carrying a wrong id."""
    EFFECTS.append(("async_note", args.get("text")))
    return common_pb2.ToolResult(
        id="not-the-call-id", content=[common_pb2.Part(text=common_pb2.TextPart(text="noted"))]
    )


def explode(args: dict[str, Any], context: ToolContext) -> None:
    EFFECTS.append(("explode", None))
    raise RuntimeError("disk on fire")


class CrashBeforeReceiptStore(DictReceiptStore):
    """A store whose receipt write never lands: the host 'dies' between effect and receipt."""

    async def put_tool_receipt(self, uid: str, idempotency_key: str, result: common_pb2.ToolResult) -> None:
        raise ConnectionError("host killed before the receipt was written")


@pytest.fixture(params=["dict", "journal-memory"])
async def receipts(request: pytest.FixtureRequest) -> AsyncIterator[ToolReceiptStore]:
    if request.param == "dict":
        yield DictReceiptStore()
        return
    journal = pytest.importorskip("agentsessions.host.journal")
    open_store = getattr(journal, "open_store", None)
    if open_store is None:
        pytest.skip("agentsessions.host.journal.open_store is not available yet")
    store = await open_store("memory:")
    try:
        yield store
    finally:
        await store.close()


def struct(value: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(value)
    return s


def tool_call(
    tool: str,
    args: dict[str, Any] | None = None,
    *,
    key: str = "key-1",
    call_id: str = "call-1",
    mediation: common_pb2.Mediation.ValueType = common_pb2.MEDIATION_CONTROLLER_MEDIATED,
) -> common_pb2.ToolCall:
    return common_pb2.ToolCall(
        id=call_id, tool=tool, args=struct(args or {}), mediation=mediation, idempotency_key=key
    )


def python_tools() -> PythonCallableExecutor:
    return PythonCallableExecutor(
        [
            CallableTool("append_line", append_line, "Append a line."),
            CallableTool("async_note", async_note),
            CallableTool("explode", explode),
        ]
    )


async def test_sync_callable_runs_in_a_worker_thread_with_context(receipts: ToolReceiptStore) -> None:
    registry = ToolRegistry(receipts, [python_tools()])
    result = await registry.execute(SESSION, tool_call("append_line", {"line": "hello"}))
    assert EFFECTS == [("append_line", "hello")]
    assert CALLER_THREADS and CALLER_THREADS[0] != threading.get_ident()
    assert result.id == "call-1"
    assert not result.is_error
    assert result.code == common_pb2.ToolResult.CODE_UNSPECIFIED
    assert dict(result.output) == {"lines": 1.0, "key": "key-1", "session": SESSION}


async def test_async_callable_result_is_correlated_to_the_call(receipts: ToolReceiptStore) -> None:
    registry = ToolRegistry(receipts, [python_tools()])
    call = tool_call("async_note", {"text": "x"}, mediation=common_pb2.MEDIATION_REQUIRES_APPROVAL)
    result = await registry.execute(SESSION, call)
    assert EFFECTS == [("async_note", "x")]
    assert result.id == "call-1"
    assert [part.text.text for part in result.content] == ["noted"]


async def test_a_recorded_key_never_reruns_after_a_crash(receipts: ToolReceiptStore) -> None:
    first = ToolRegistry(receipts, [python_tools()])
    original = await first.execute(SESSION, tool_call("append_line", {"line": "once"}))
    # The host dies; a new host (new registry, new executors) recovers over the same store.
    recovered = ToolRegistry(receipts, [python_tools()])
    again = await recovered.execute(SESSION, tool_call("append_line", {"line": "once"}))
    assert EFFECTS == [("append_line", "once")]
    assert again == original


async def test_a_recorded_key_never_reruns_after_a_sqlite_reopen(tmp_path: Path) -> None:
    journal = pytest.importorskip("agentsessions.host.journal")
    open_store = getattr(journal, "open_store", None)
    if open_store is None:
        pytest.skip("agentsessions.host.journal.open_store is not available yet")
    target = f"sqlite://{tmp_path / 'journal.db'}"
    store = await open_store(target)
    try:
        original = await ToolRegistry(store, [python_tools()]).execute(
            SESSION, tool_call("append_line", {"line": "durable"})
        )
    finally:
        await store.close()
    reopened = await open_store(target)
    try:
        again = await ToolRegistry(reopened, [python_tools()]).execute(
            SESSION, tool_call("append_line", {"line": "durable"})
        )
    finally:
        await reopened.close()
    assert EFFECTS == [("append_line", "durable")]
    assert again == original


async def test_dedup_is_per_session_and_key(receipts: ToolReceiptStore) -> None:
    registry = ToolRegistry(receipts, [python_tools()])
    await registry.execute(SESSION, tool_call("append_line", {"line": "a"}, key="k1"))
    await registry.execute(SESSION, tool_call("append_line", {"line": "b"}, key="k2"))
    await registry.execute("sess-other", tool_call("append_line", {"line": "c"}, key="k1"))
    assert [effect[1] for effect in EFFECTS] == ["a", "b", "c"]


async def test_the_window_between_effect_and_receipt_reruns_once() -> None:
    # Documented at-most-once gap: the receipt write is what makes the effect "done".
    with pytest.raises(ConnectionError):
        await ToolRegistry(CrashBeforeReceiptStore(), [python_tools()]).execute(
            SESSION, tool_call("append_line", {"line": "x"})
        )
    store = DictReceiptStore()
    await ToolRegistry(store, [python_tools()]).execute(SESSION, tool_call("append_line", {"line": "x"}))
    assert EFFECTS == [("append_line", "x"), ("append_line", "x")]
    assert (SESSION, "key-1") in store.receipts


async def test_executor_exception_becomes_a_durable_error_receipt(receipts: ToolReceiptStore) -> None:
    registry = ToolRegistry(receipts, [python_tools()])
    result = await registry.execute(SESSION, tool_call("explode"))
    assert result.is_error
    assert result.code == common_pb2.ToolResult.EXECUTOR_ERROR
    assert result.error == "RuntimeError: disk on fire"
    assert result.id == "call-1"
    recorded = await receipts.get_tool_receipt(SESSION, "key-1")
    assert recorded == result
    # The failure is the outcome of that key: a re-drive answers with it instead of re-running.
    assert await ToolRegistry(receipts, [python_tools()]).execute(SESSION, tool_call("explode")) == result
    assert EFFECTS == [("explode", None)]


async def test_a_hung_executor_times_out_into_an_error_receipt() -> None:
    never = asyncio.Event()

    async def hang(args: dict[str, Any], context: ToolContext) -> None:
        await never.wait()

    registry = ToolRegistry(
        DictReceiptStore(), [PythonCallableExecutor([CallableTool("hang", hang)])], timeout_s=0.05
    )
    result = await registry.execute(SESSION, tool_call("hang"))
    assert result.is_error
    assert result.code == common_pb2.ToolResult.EXECUTOR_ERROR
    assert result.error == "tool 'hang' timed out after 0.05s"


async def test_a_timeout_the_tool_raises_itself_is_its_failure_not_the_hosts_limit() -> None:
    def gives_up(args: dict[str, Any], context: ToolContext) -> None:
        raise TimeoutError("the upstream API did not answer in 2 s")

    registry = ToolRegistry(
        DictReceiptStore(), [PythonCallableExecutor([CallableTool("upstream", gives_up)])], timeout_s=300
    )
    result = await registry.execute(SESSION, tool_call("upstream"))
    assert result.is_error
    assert result.error == "TimeoutError: the upstream API did not answer in 2 s"


async def test_tool_reported_errors_get_the_executor_error_code_and_no_approval_fields() -> None:
    def fails_softly(args: dict[str, Any], context: ToolContext) -> common_pb2.ToolResult:
        return common_pb2.ToolResult(
            is_error=True, code=common_pb2.ToolResult.APPROVAL_DENIED, approval_request_seq=7
        )

    registry = ToolRegistry(
        DictReceiptStore(), [PythonCallableExecutor([CallableTool("soft", fails_softly)])]
    )
    result = await registry.execute(SESSION, tool_call("soft"))
    assert result.is_error
    assert result.code == common_pb2.ToolResult.EXECUTOR_ERROR
    assert result.error == "tool 'soft' reported an error"
    assert result.approval_request_seq == 0


async def test_missing_executor_is_typed_and_records_nothing() -> None:
    store = DictReceiptStore()
    registry = ToolRegistry(store, [python_tools()])
    with pytest.raises(MissingToolExecutorError, match="no tool executor serves tool 'rm_rf'"):
        await registry.execute(SESSION, tool_call("rm_rf"))
    assert store.receipts == {}


async def test_calls_the_host_must_not_run_are_refused_before_any_effect() -> None:
    store = DictReceiptStore()
    registry = ToolRegistry(store, [python_tools()])
    with pytest.raises(MissingIdempotencyKeyError):
        await registry.execute(SESSION, tool_call("append_line", {"line": "x"}, key=""))
    with pytest.raises(UnmediatedToolCallError):
        await registry.execute(
            SESSION,
            tool_call("append_line", {"line": "x"}, mediation=common_pb2.MEDIATION_IN_HARNESS_REPORTED),
        )
    assert EFFECTS == []
    assert store.receipts == {}


async def test_concurrent_duplicates_run_the_effect_once() -> None:
    gate = asyncio.Event()
    running = asyncio.Event()
    runs: list[str] = []

    async def slow(args: dict[str, Any], context: ToolContext) -> str:
        runs.append(context.call_id)
        running.set()
        await gate.wait()
        return "done"

    registry = ToolRegistry(DictReceiptStore(), [PythonCallableExecutor([CallableTool("slow", slow)])])
    first = asyncio.create_task(registry.execute(SESSION, tool_call("slow", call_id="a")))
    second = asyncio.create_task(registry.execute(SESSION, tool_call("slow", call_id="b")))
    await running.wait()
    gate.set()
    results = await asyncio.gather(first, second)
    assert runs == ["a"]
    assert [r.id for r in results] == ["a", "b"]
    assert results[0].content == results[1].content


async def test_duplicate_tool_names_are_refused_at_start() -> None:
    registry = ToolRegistry(DictReceiptStore(), [python_tools(), python_tools()])
    with pytest.raises(DuplicateToolError, match="'append_line'"):
        await registry.start()


async def test_registry_lists_tools_once_started() -> None:
    registry = ToolRegistry(DictReceiptStore(), [python_tools()])
    assert registry.tools() == []
    await registry.start()
    assert [spec.name for spec in registry.tools()] == ["append_line", "async_note", "explode"]
    assert registry.serves("explode") and not registry.serves("nope")
    definition = registry.tools()[0].definition()
    assert definition.description == "Append a line."
    assert dict(definition.input_schema) == {"type": "object"}


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        (None, common_pb2.ToolResult(id="call-1")),
        (
            "text",
            common_pb2.ToolResult(
                id="call-1", content=[common_pb2.Part(text=common_pb2.TextPart(text="text"))]
            ),
        ),
        ([1, 2], common_pb2.ToolResult(id="call-1", output=struct({"result": [1, 2]}))),
        ({"ok": True}, common_pb2.ToolResult(id="call-1", output=struct({"ok": True}))),
    ],
)
async def test_return_values_map_onto_results(returned: object, expected: common_pb2.ToolResult) -> None:
    def give(args: dict[str, Any], context: ToolContext) -> object:
        return returned

    registry = ToolRegistry(DictReceiptStore(), [PythonCallableExecutor([CallableTool("give", give)])])
    assert await registry.execute(SESSION, tool_call("give")) == expected


async def test_non_json_return_values_fail_the_call() -> None:
    def give_nan(args: dict[str, Any], context: ToolContext) -> object:
        return {"x": float("nan")}

    registry = ToolRegistry(DictReceiptStore(), [PythonCallableExecutor([CallableTool("nan", give_nan)])])
    result = await registry.execute(SESSION, tool_call("nan"))
    assert result.is_error
    assert result.error == "InvalidToolArgumentsError: output.x: NaN is not JSON-shaped"


async def test_from_import_path_names_and_describes_the_tool() -> None:
    executor = PythonCallableExecutor.from_import_path(f"{__name__}:append_line")
    assert [(s.name, s.description) for s in executor.tools()] == [
        ("append_line", "Append a line to the effect log (sync: runs in a worker thread).")
    ]
    renamed = PythonCallableExecutor.from_import_path(
        f"{__name__}:append_line", name="log_it", description=""
    )
    assert [(s.name, s.description) for s in renamed.tools()] == [("log_it", "")]
    result = await ToolRegistry(DictReceiptStore(), [renamed]).execute(
        SESSION, tool_call("log_it", {"line": "z"})
    )
    assert not result.is_error
    assert EFFECTS == [("append_line", "z")]
