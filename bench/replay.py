"""Replay benchmark: controller replay of a 1,000-turn session with zero model calls.

DESIGN.md goal: replaying a 1,000-turn session in under 0.5 s with zero model calls. The
baseline measured in the same run is reading and decoding the same journal from the store
(the floor any replay pays); the ratio says how much re-running the harness against its
recorded effects costs on top of that.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Final

from agentsessions.harnesses.echo import EchoHarness
from agentsessions.host.controller.controller import Controller
from agentsessions.host.controller.harnesses import HarnessCatalog, StaticHarness
from agentsessions.host.controller.turns import ExecParams
from agentsessions.host.harnesslink import RemoteHarness
from agentsessions.host.journal import open_store
from agentsessions.host.journal.store import JournalStore, SessionRow
from agentsessions.host.models.echo import EchoModel
from agentsessions.sdk.harness import text_message
from bench import resultfile

RESULTS: Final = Path(__file__).resolve().parent / "results" / "replay.json"
GOAL_REPLAY_S: Final = 0.5
ROUNDS: Final = 5


def echo_host(store: JournalStore) -> Controller:
    """An in-process host on ``store``: the echo harness and model, deltas off (also bench.listing's)."""
    catalog = HarnessCatalog({"echo": StaticHarness(EchoHarness())}, store, RemoteHarness)
    return Controller(store, catalog, EchoModel(), stream_deltas=False)


async def _build(path: str, turns: int) -> str:
    """A session of ``turns`` echo turns (built with synchronous=OFF: building is not timed)."""
    store = await open_store(path, synchronous="OFF")
    try:
        controller = echo_host(store)
        view = await controller.create_session(SessionRow(uid="", project="", harness="echo"))
        uid = view.row.uid
        for i in range(turns):
            params = ExecParams(session=uid, inputs=[text_message("user", f"turn {i}")])
            async with controller.admit_exec(params) as turn:
                async for _ in turn.run():
                    pass
        return uid
    finally:
        await store.close()


async def _measure(path: str, uid: str) -> dict[str, float]:
    store = await open_store(path)
    try:
        records = await store.read(uid)
        read_s: list[float] = []
        replay_s: list[float] = []
        model_calls = 0
        outputs = 0
        for _ in range(ROUNDS):
            t = time.perf_counter()
            await store.read(uid)
            read_s.append(time.perf_counter() - t)
            controller = echo_host(store)  # cold: nothing cached from an earlier round
            t = time.perf_counter()
            report = await controller.replay(uid)
            replay_s.append(time.perf_counter() - t)
            model_calls += report.model_calls
            outputs = len(report.outputs)
        after = await store.read(uid)
        assert [r.content_hash for r in after] == [r.content_hash for r in records], "replay wrote"
        return {
            "records": float(len(records)),
            "executions": float(report.executions),
            "outputs": float(outputs),
            "model_calls": float(model_calls),
            "read_decode_s": statistics.median(read_s),
            "replay_s": statistics.median(replay_s),
        }
    finally:
        await store.close()


def run(*, quick: bool, out: Path = RESULTS) -> int:
    turns = 100 if quick else 1_000
    with tempfile.TemporaryDirectory(prefix="agentsessions-bench-replay-") as tmp:
        path = str(Path(tmp) / "replay.db")
        uid = asyncio.run(_build(path, turns))
        m = asyncio.run(_measure(path, uid))
    ratio = m["replay_s"] / m["read_decode_s"] if m["read_decode_s"] else float("inf")
    met = m["replay_s"] < GOAL_REPLAY_S and m["model_calls"] == 0
    print(f"\nreplay of a {turns}-turn session ({int(m['records'])} records), median of {ROUNDS}, cold cache")
    print(f"  baseline: read + decode the journal   {m['read_decode_s'] * 1000:8.1f} ms")
    print(f"  controller replay (harness re-run)    {m['replay_s'] * 1000:8.1f} ms   {ratio:5.1f}x baseline")
    print(f"  model calls during replay             {int(m['model_calls']):8d}")
    goal = f"< {GOAL_REPLAY_S * 1000:.0f} ms, 0 model calls"
    verdict = "met" if met else "MISSED"
    if quick:
        verdict += " (quick run: not a measurement)"
    print(f"  goal {goal}: {verdict}")
    document = {
        "benchmark": "replay",
        "when_unix": int(time.time()),
        "machine": resultfile.machine(),
        "quick": quick,
        "turns": turns,
        "results": m,
        "ratio_replay_to_read": ratio,
        "goal": {"replay_s_below": GOAL_REPLAY_S, "model_calls": 0, "met": met},
    }
    resultfile.write(out, document)
    print(f"wrote {out}")
    return 0
