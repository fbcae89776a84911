"""The three framework examples, each served as a real harness process from ``examples/`` against a
real host process whose model is a scripted OpenAI-compatible endpoint on loopback and whose
host-run tools come from ``examples/tools.toml``.

Every example does the same session: a live turn whose completion calls a host-run tool and an
in-harness tool at once; a turn that asks for a refund, parks on the approval, is approved and
resumed to the end; ``agentsessions replay`` with zero requests at the endpoint and no tool run
again; a fork that continues with a new turn on the whole conversation.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentsessions.client import SessionsClient
from agentsessions.sdk import convert
from agentsessions.v1 import common_pb2, session_pb2
from tests.support.host_process import BIN, HostProcess, repo_env
from tests.support.processes import HarnessProcess, harness_process, serve_argv
from tests.support.scripted_endpoint import Reply, ScriptedEndpoint

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
MODEL = "scripted-gpt"
K = common_pb2
# Process-level limits: each step is bounded, none is a timing assertion.
STEP_LIMIT_S = 120.0

EXAMPLE_TARGETS = {
    "pydantic-ai": "pydantic_ai_agent:harness",
    "openai-agents": "openai_agents_agent:harness",
    "langgraph": "langgraph_agent:harness",
}


def looking_up() -> Reply:
    """One completion that calls a host-run tool and an in-harness tool together."""
    return Reply.completion(
        "",
        tool_calls=[
            {"id": "call_lookup", "name": "lookup_order", "args": {"order_id": "A-1001"}},
            {
                "id": "call_note",
                "name": "add_note",
                "args": {"order_id": "A-1001", "text": "told: delivered"},
            },
        ],
        usage={"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52},
    )


def refunding() -> Reply:
    return Reply.completion(
        "",
        tool_calls=[
            {"id": "call_refund", "name": "refund", "args": {"order_id": "A-1001", "amount_cents": 500}}
        ],
    )


def harness_env(tmp_path: Path) -> dict[str, str]:
    """What the harness process gets: no PYTHONPATH (the CLI puts its folder on the path), the
    notes file, and dummy provider settings pointing at a closed loopback port, so a framework
    that reached for a provider on its own would fail here instead of leaving the machine."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OPENAI_API_KEY", "MODEL_API_KEY")}
    env.update(
        SHOP_NOTES=str(tmp_path / "notes.txt"),
        OPENAI_API_KEY="sk-dummy-never-sent",
        OPENAI_BASE_URL="http://127.0.0.1:9/v1",
        OPENAI_AGENTS_DISABLE_TRACING="1",
        LANGSMITH_TRACING="false",
    )
    return env


@pytest.fixture(params=sorted(EXAMPLE_TARGETS))
async def served(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[str, HarnessProcess]]:
    framework: str = request.param
    argv = serve_argv(EXAMPLE_TARGETS[framework])
    async with harness_process(argv, cwd=EXAMPLES, env=harness_env(tmp_path)) as harness:
        yield framework, harness


@pytest.fixture
async def host(
    tmp_path: Path,
    endpoint: ScriptedEndpoint,
    served: tuple[str, HarnessProcess],
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[HostProcess]:
    # The host imports examples/shop_tools.py for the executors that tools.toml names.
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLES))
    monkeypatch.setenv("SHOP_LEDGER", str(tmp_path / "ledger.jsonl"))
    tools = ["--tools-config", str(EXAMPLES / "tools.toml")]
    process = HostProcess(tmp_path / "journal.db", tmp_path, [*host_args(endpoint, served[1]), *tools])
    await process.start()
    try:
        yield process
    finally:
        await process.close()


def host_args(endpoint: ScriptedEndpoint, harness: HarnessProcess) -> list[str]:
    return [
        "--model",
        MODEL,
        "--model-base-url",
        endpoint.base_url,
        "--harness",
        f"shop={harness.address}",
    ]


async def turn(client: SessionsClient, uid: str, text: str) -> list[common_pb2.LogRecord]:
    records = []
    async with asyncio.timeout(STEP_LIMIT_S):
        async for update in client.exec(uid, text):
            if update.WhichOneof("update") == "record":
                records.append(update.record)
    return records


def kinds(records: list[common_pb2.LogRecord]) -> list[str]:
    return [common_pb2.EventKind.Name(r.event.kind).removeprefix("EVENT_") for r in records]


def outputs(records: list[common_pb2.LogRecord]) -> list[str]:
    return [
        "".join(p.text.text for p in r.event.message.parts)
        for r in records
        if r.event.kind == K.EVENT_OUTPUT and any(p.text.text for p in r.event.message.parts)
    ]


async def journal(client: SessionsClient, uid: str) -> list[common_pb2.LogRecord]:
    async with asyncio.timeout(STEP_LIMIT_S):
        return [record async for record in client.replay(uid)]


async def replay_cli(
    tmp_path: Path, uid: str, endpoint: ScriptedEndpoint, harness: HarnessProcess
) -> tuple[int, str]:
    argv = [str(BIN / "agentsessions"), "replay", "--journal", str(tmp_path / "journal.db"), "--session", uid]
    process = await asyncio.create_subprocess_exec(
        *argv,
        *host_args(endpoint, harness),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=repo_env(),
        cwd=tmp_path,
    )
    async with asyncio.timeout(STEP_LIMIT_S):
        out, _ = await process.communicate()
    return process.returncode or 0, out.decode()


async def test_example_lives_parks_replays_and_forks(
    tmp_path: Path, endpoint: ScriptedEndpoint, served: tuple[str, HarnessProcess], host: HostProcess
) -> None:
    framework, harness = served
    notes = tmp_path / "notes.txt"
    ledger = tmp_path / "ledger.jsonl"
    async with SessionsClient.connect(host.address) as client:
        session = await client.create_session(harness="shop")
        uid = session.metadata.uid

        # A live turn: one completion calls lookup_order (the host runs it) and add_note (the
        # harness runs it) together; the framework runs them concurrently, the journal holds
        # them in the completion's order.
        endpoint.script(looking_up(), Reply.completion("Order A-1001 was delivered."))
        first = await turn(client, uid, "Where is my order A-1001?")
        assert kinds(first)[-1] == "END", (framework, kinds(first))
        calls = [
            (r.event.kind, r.event.tool.tool or r.event.result.id)
            for r in first
            if r.event.kind in (K.EVENT_TOOL_CALL, K.EVENT_TOOL_RESULT)
        ]
        assert calls == [
            (K.EVENT_TOOL_CALL, "lookup_order"),
            (K.EVENT_TOOL_RESULT, "call_lookup"),
            (K.EVENT_TOOL_RESULT, "call_note"),
        ], framework
        lookup = next(r.event.result for r in first if r.event.result.id == "call_lookup")
        assert convert.dict_from_struct(lookup.output)["status"] == "delivered"
        assert outputs(first) == ["Order A-1001 was delivered."]
        assert notes.read_text() == "A-1001: told: delivered\n"
        assert [r.event.usage.input_tokens for r in first if r.event.kind == K.EVENT_USAGE] == [40]

        # The refund parks on its approval; Approve records the decision; Resume ends the turn.
        endpoint.script(refunding(), Reply.completion("I refunded 5.00 on order A-1001."))
        second = await turn(client, uid, "Please refund 500 cents on A-1001.")
        assert kinds(second)[-2:] == ["APPROVAL_REQUEST", "LIFECYCLE"], kinds(second)
        request = next(r.event.approval for r in second if r.event.kind == K.EVENT_APPROVAL_REQUEST)
        assert request.reason == "refund 500 cents of A-1001"
        state = await client.get_session(uid)
        assert state.exec_state == session_pb2.EXEC_AWAITING
        assert not ledger.exists()
        await client.approve(state.pending_approval, uid, approved=True, reason="customer is right")
        async with asyncio.timeout(STEP_LIMIT_S):
            resumed = await client.resume(uid)
        assert resumed.exec_state == session_pb2.EXEC_COMPLETED, resumed
        records = await journal(client, uid)
        assert outputs(records)[-1] == "I refunded 5.00 on order A-1001."
        receipt = next(
            r.event.result
            for r in records
            if r.event.kind == K.EVENT_TOOL_RESULT and r.event.result.id == "call_refund"
        )
        assert receipt.approval_decision_seq > 0 and not receipt.is_error
        assert ledger.read_text().splitlines() == ['{"order_id": "A-1001", "amount_cents": 500}']
        assert notes.read_text() == "A-1001: told: delivered\n", "the in-harness tool ran again on Resume"
        requests_live = len(endpoint.received)
        assert requests_live == 4, "one request per model call, none repeated on Resume"

        # agentsessions replay: every execution re-runs against the journal, nothing reaches the
        # endpoint, no tool runs again.
        code, report = await replay_cli(tmp_path, uid, endpoint, harness)
        assert code == 0, report
        assert re.search(r"replays: \d+ executions, .* 0 sent to the provider", report), report
        assert len(endpoint.received) == requests_live
        assert notes.read_text() == "A-1001: told: delivered\n"
        assert len(ledger.read_text().splitlines()) == 1

        # A fork continues with a new turn that sees the whole conversation.
        head = (await client.get_session(uid)).last_seq
        (child,) = await client.fork(uid, at_seq=head)
        endpoint.script(Reply.completion("You're welcome!"))
        third = await turn(client, child.metadata.uid, "Thanks!")
        assert outputs(third) == ["You're welcome!"]
        sent = endpoint.received[-1].body
        texts = json.dumps(sent["messages"])
        assert "Where is my order A-1001?" in texts and "refunded_cents" in texts and "Thanks!" in texts
        assert sent["model"] == MODEL
