"""One crash scenario's world: a host process over a SQLite journal, the crash harness in its own
process, the counting chat-completions endpoint (in this process, so it outlives the host) and the
effect tool run by the host. Tests drive it over the real Sessions gRPC API."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc

from agentsessions.host.journal.sqlite import SqliteStore
from agentsessions.v1 import common_pb2, session_pb2
from tests.support import crash_harness, effect_tool
from tests.support.chat_completions import ChatCompletionsServer
from tests.support.host_process import BIN, HarnessProcess, HostProcess, repo_env

K = common_pb2.EventKind
LK = common_pb2.Lifecycle.Kind
WAIT_LIMIT_S = 60.0
POLL_S = 0.02
HARNESS = "crash"
PROMPT = "hello"

# The journal of one uninterrupted CrashHarness turn (crash_harness's script), in order.
SCRIPT_KINDS = [
    K.EVENT_EXECUTION_START,
    K.EVENT_INPUT,
    K.EVENT_MODEL_CALL,
    K.EVENT_OUTPUT,
    K.EVENT_USAGE,
    K.EVENT_TOOL_CALL,
    K.EVENT_TOOL_RESULT,
    K.EVENT_TOOL_RESULT,
    K.EVENT_MODEL_CALL,
    K.EVENT_OUTPUT,
    K.EVENT_USAGE,
    K.EVENT_OUTPUT,
    K.EVENT_END,
]
# How much of that journal is durable when a turn stands at each cut point.
DURABLE_AT_CUT = {
    "during_model_call": 3,
    "after_model_call": 4,
    "after_usage": 5,
    "during_tool_call": 6,
    "after_tool_call": 7,
    "after_tool_result": 8,
    "after_output": 12,
}
MODEL_CALLS = SCRIPT_KINDS.count(K.EVENT_MODEL_CALL)


def kind_names(records: list[common_pb2.LogRecord]) -> list[str]:
    return [K.Name(r.event.kind) for r in records]


def of_kind(records: list[common_pb2.LogRecord], kind: int) -> list[common_pb2.LogRecord]:
    return [r for r in records if r.event.kind == kind]


def text_of(message: common_pb2.Message) -> str:
    return "".join(p.text.text for p in message.parts if p.WhichOneof("part") == "text")


async def wait_until(what: str, ready: Callable[[], bool], *, limit: float = WAIT_LIMIT_S) -> None:
    """Poll ``ready()`` until true; fail naming ``what`` once ``limit`` seconds pass."""
    try:
        async with asyncio.timeout(limit):
            # Polled: other processes and threads signal through files and thread events.
            while not ready():  # noqa: ASYNC110
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        raise AssertionError(f"gave up after {limit} s waiting for {what}") from None


class ExecInFlight:
    """An Exec stream being drained in the background."""

    def __init__(self, call: grpc.aio.UnaryStreamCall) -> None:
        self.updates: list[session_pb2.ExecUpdate] = []
        self._call = call
        self.task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        async for update in self._call:
            self.updates.append(update)

    @property
    def records(self) -> list[common_pb2.LogRecord]:
        return [u.record for u in self.updates if u.WhichOneof("update") == "record"]

    @property
    def session(self) -> str:
        first = self.updates[0]
        assert first.WhichOneof("update") == "session", first
        return first.session.metadata.uid

    async def status(self) -> grpc.StatusCode:
        """How the stream ended (bounded wait)."""
        try:
            async with asyncio.timeout(WAIT_LIMIT_S):
                await self.task
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK


class CrashScenario:
    """Host + harness processes and the model endpoint for one test; see the module doc."""

    def __init__(self, tmp: Path, socket_dir: Path, model: ChatCompletionsServer) -> None:
        self.control = tmp / "control"
        self.control.mkdir()
        self.journal = tmp / "journal.db"
        self.model = model
        self.harness = HarnessProcess(
            "tests.support.crash_harness:CrashHarness", f"unix:{socket_dir / 'harness.sock'}", tmp
        )
        self.tmp = tmp
        self.host_args = [
            "--harness",
            f"{HARNESS}={self.harness.address}",
            "--model",
            "chaos-model",
            "--model-base-url",
            model.base_url,
            "--tool-executor",
            "python:tests.support.effect_tool:record_effect",
            *self.recovery_args(),
        ]
        self.host = HostProcess(self.journal, tmp, self.host_args)
        self._turns: list[ExecInFlight] = []

    def recovery_args(self) -> list[str]:
        """These scenarios recover by hand (Resume), as the reference does: no automatic recovery."""
        return ["--recover", "off"]

    def another_host(self, name: str) -> HostProcess:
        """A second host on the same journal, harness, model and tool (not started)."""
        return HostProcess(self.journal, self.tmp, self.host_args, name=name)

    async def start(self) -> None:
        # The host dials its harness only when a turn needs it, so both can start at once.
        await asyncio.gather(self.harness.start(), self.host.start())

    async def close(self) -> None:
        await self.host.close()
        await self.harness.close()
        for turn in self._turns:  # a test that failed early may have left a stream undrained
            turn.task.cancel()
            with contextlib.suppress(BaseException):
                await turn.task

    # -- driving a turn ------------------------------------------------------------------

    def exec_turn(self, cut: str, *, approval: bool = False) -> ExecInFlight:
        """Start a crash-harness turn in a new session that stops at ``cut`` (see
        ``crash_harness.turn_config`` for ``approval``)."""
        if cut == "during_model_call":
            self.model.hold_next()
        request = session_pb2.ExecRequest(
            harness=HARNESS,
            inputs=[
                common_pb2.Message(
                    role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text=PROMPT))]
                )
            ],
            config=crash_harness.turn_config(self.control, cut, approval=approval),
        )
        turn = ExecInFlight(self.host.sessions.Exec(request))
        self._turns.append(turn)
        return turn

    def _stopped_at(self, cut: str) -> bool:
        if cut == "during_model_call":
            return self.model.held.is_set()
        if cut == "during_tool_call":
            return (self.control / effect_tool.ENTERED).exists()
        stops = self.harness_stops()
        return bool(stops) and stops[-1] == cut

    def harness_stops(self) -> list[str]:
        """The cut point of every harness run that stopped, in order."""
        blocked = self.control / crash_harness.BLOCKED
        return blocked.read_text().splitlines() if blocked.exists() else []

    async def wait_for_cut(self, turn: ExecInFlight, cut: str) -> None:
        """Until the turn stands at ``cut`` with exactly the journal prefix the script puts there."""
        durable = SCRIPT_KINDS[: DURABLE_AT_CUT[cut]]

        def stopped() -> bool:
            if turn.task.done():
                raise AssertionError(f"the turn ended before {cut}: {kind_names(turn.records)}")
            return self._stopped_at(cut) and [r.event.kind for r in turn.records] == durable

        await wait_until(f"the turn to stop at {cut}", stopped)

    def release(self) -> None:
        """Let held harness runs, tool calls and model requests go on (later runs do not stop)."""
        (self.control / crash_harness.RELEASE).touch()
        self.model.release()

    # -- reading the outcome ---------------------------------------------------------------

    async def resume(self, uid: str) -> session_pb2.Session:
        session: session_pb2.Session = await self.host.sessions.Resume(
            session_pb2.ResumeRequest(session=uid), timeout=WAIT_LIMIT_S
        )
        return session

    async def resume_when_reachable(self, uid: str) -> session_pb2.Session:
        """Resume, retrying while the host answers UNAVAILABLE (its harness channel has not
        reconnected yet); bounded."""
        try:
            async with asyncio.timeout(WAIT_LIMIT_S):
                while True:
                    try:
                        return await self.resume(uid)
                    except grpc.aio.AioRpcError as exc:
                        if exc.code() != grpc.StatusCode.UNAVAILABLE:
                            raise
                    await asyncio.sleep(POLL_S)
        except TimeoutError:
            raise AssertionError(f"Resume stayed UNAVAILABLE for {WAIT_LIMIT_S} s") from None

    async def records(self, uid: str) -> list[common_pb2.LogRecord]:
        call = self.host.sessions.Replay(session_pb2.ReplayRequest(session=uid), timeout=WAIT_LIMIT_S)
        return [record async for record in call]

    def tool_entries(self) -> list[dict[str, object]]:
        """Tool calls that stopped inside the tool, in order."""
        return effect_tool.read_lines(self.control / effect_tool.ENTERED)

    def tool_attempts(self) -> list[dict[str, object]]:
        return effect_tool.read_lines(self.control / effect_tool.ATTEMPTS)

    def tool_effects(self) -> list[dict[str, object]]:
        return effect_tool.read_lines(self.control / effect_tool.EFFECTS)

    async def verify_store(self) -> dict[str, int]:
        """Every session's hash chain in the journal file, checked in this process (no host needed):
        records verified per session; raises TamperedError on a broken chain."""
        store = await SqliteStore.open(self.journal)
        try:
            return {uid: await store.verify(uid) for uid in await store.session_uids()}
        finally:
            await store.close()

    async def verify_journal(self) -> subprocess.CompletedProcess[str]:
        """``agentsessions journal verify`` on the journal file, as an operator runs it."""
        return await verify_journal_file(self.journal)


async def verify_journal_file(journal: Path) -> subprocess.CompletedProcess[str]:
    """``agentsessions journal verify`` on ``journal``, as an operator runs it (bounded)."""
    argv = [str(BIN / "agentsessions"), "journal", "verify", "--journal", str(journal)]
    return await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=WAIT_LIMIT_S, env=repo_env()
    )


async def verify_chain(world: CrashScenario, uid: str, records: list[common_pb2.LogRecord]) -> None:
    """The journal file's chain verifies, up to the records the host served."""
    assert await world.verify_store() == {uid: len(records)}


@contextlib.asynccontextmanager
async def started(
    kind: type[CrashScenario], tmp_path: Path, model_endpoint: ChatCompletionsServer
) -> AsyncIterator[CrashScenario]:
    """A started scenario of ``kind``, closed afterwards."""
    # A short directory of its own for the harness's unix socket (paths are capped near 108 bytes).
    socket_dir = Path(tempfile.mkdtemp(prefix="asc-", dir="/tmp"))
    world = kind(tmp_path, socket_dir, model_endpoint)
    try:
        await world.start()
        yield world
    finally:
        await world.close()
        shutil.rmtree(socket_dir, ignore_errors=True)
