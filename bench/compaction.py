"""Turn cost of a long chat session, with and without compaction, in the same run.

Two ``agentsessions serve`` hosts as shipped (SQLite journal, ``synchronous=FULL``, the built-in
echo model), each dialling its own chat harness process (``agentsessions-harness serve
agentsessions.harnesses.chat:ChatHarness``: every turn sends the whole conversation its
Start.history holds to the model, so a turn's cost follows the history's length). One host runs
with ``--compact-above-events N``, the other without. One session on each takes its turns
alternately, one turn here, one there, so both are timed in the same seconds of a shared
machine. Reported, at each position (turn 10, 1,000, 10,000): the median latency of the turns
around it (``position - 5`` to ``position + 5``, as ``bench turns`` flatness does) and the mean of
the 101 turns around it (the turns that paid for a compaction included), for each host; the goal
is the compacting session's turn 10,000 within 1.2x of its turn 10.

``python -m bench compaction`` (10,005 turns a session, ~10 minutes); ``--quick``: turn 100.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import grpc

from agentsessions.sdk.limits import MESSAGE_SIZE_OPTIONS
from agentsessions.v1 import common_pb2, session_pb2, session_pb2_grpc
from bench.turns import BIN, fleet

ROOT: Final = Path(__file__).resolve().parent.parent
RESULTS: Final = ROOT / "bench" / "results" / "compaction.json"
MEDIAN_WINDOW: Final = 5  # turns each side of a position: its median
MEAN_WINDOW: Final = 50  # turns each side of a position: its mean (compaction turns included)
GOAL: Final = 1.2


@dataclass(frozen=True)
class Sizes:
    positions: tuple[int, ...]
    compact_above_events: int


# 50 events (~10 turns of history): a compacted history stays about as long as turn 10's.
FULL: Final = Sizes(positions=(10, 1_000, 10_000), compact_above_events=50)
QUICK: Final = Sizes(positions=(10, 100), compact_above_events=50)


def _request(uid: str, text: str) -> session_pb2.ExecRequest:
    part = common_pb2.Part(text=common_pb2.TextPart(text=text))
    return session_pb2.ExecRequest(session=uid, inputs=[common_pb2.Message(role="user", parts=[part])])


async def _turn(stub: session_pb2_grpc.SessionsAsyncStub, uid: str, text: str) -> float:
    """One Exec, drained; its latency in seconds."""
    began = time.perf_counter()
    ended = ""
    async for update in stub.Exec(_request(uid, text)):
        if update.HasField("record") and update.record.event.kind == common_pb2.EVENT_END:
            ended = update.record.event.end.state
    took = time.perf_counter() - began
    if ended != "COMPLETED":
        raise RuntimeError(f"session {uid}: the turn ended {ended or 'without END'}")
    return took


async def _alternate(
    targets: dict[str, str], turns: dict[str, int], log: Any
) -> tuple[dict[str, list[float]], dict[str, dict[str, int]]]:
    """``turns`` turns on one chat session per target, one target after the other each round."""
    channels = {
        name: grpc.aio.insecure_channel(addr, options=MESSAGE_SIZE_OPTIONS) for name, addr in targets.items()
    }
    try:
        stubs = {name: session_pb2_grpc.SessionsStub(ch) for name, ch in channels.items()}
        uids = {}
        for name, stub in stubs.items():
            created = await stub.CreateSession(
                session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="bench-chat"))
            )
            uids[name] = created.metadata.uid
        latencies: dict[str, list[float]] = {name: [] for name in targets}
        for i in range(max(turns.values())):
            for name, stub in stubs.items():
                if i < turns[name]:
                    latencies[name].append(await _turn(stub, uids[name], f"question {i}"))  # type: ignore[arg-type]
            if (i + 1) % 500 == 0:
                print(f"  turn {i + 1}/{max(turns.values())}", file=log, flush=True)
        journals = {}
        for name, stub in stubs.items():
            records = baselines = 0
            async for record in stub.Replay(session_pb2.ReplayRequest(session=uids[name])):
                records += 1
                baselines += record.event.lifecycle.kind == common_pb2.Lifecycle.LIFECYCLE_BASELINE
            journals[name] = {"records": records, "baselines": baselines}
        return latencies, journals
    finally:
        for ch in channels.values():
            await ch.close()


def _around(series: list[float], position: int, window: int) -> list[float]:
    return series[max(position - 1 - window, 0) : position + window]


def measure(sizes: Sizes, workdir: Path, log: Any, without_until: int = 0) -> dict[str, Any]:
    """``without_until``: the session without compaction stops after that turn (0: it goes on to
    the last position too), its later positions not measured."""
    last = sizes.positions[-1]
    with fleet(workdir) as f:
        harness_argv = [
            str(BIN / "agentsessions-harness"),
            "serve",
            "agentsessions.harnesses.chat:ChatHarness",
            "--listen",
            "127.0.0.1:0",
        ]
        plain_chat = f.announced("chat-harness-plain", harness_argv)
        compact_chat = f.announced("chat-harness-compacting", harness_argv)
        plain = f.host("host-plain", str(workdir / "plain.db"), {"bench-chat": plain_chat})
        # The flag through its environment variable: the fleet's hosts take the bench's environment.
        os.environ["AGENTSESSIONS_COMPACT_ABOVE_EVENTS"] = str(sizes.compact_above_events)
        try:
            compacting = f.host(
                "host-compacting", str(workdir / "compacting.db"), {"bench-chat": compact_chat}
            )
        finally:
            del os.environ["AGENTSESSIONS_COMPACT_ABOVE_EVENTS"]
        targets = {"without": plain, "with": compacting}
        began = time.monotonic()
        turns = {"without": (without_until or last) + MEAN_WINDOW, "with": last + MEAN_WINDOW}
        latencies, journals = asyncio.run(_alternate(targets, turns, log))
        elapsed = time.monotonic() - began
    rows: dict[str, dict[str, dict[str, float]]] = {}
    for name, series in latencies.items():
        rows[name] = {
            str(p): {
                "median_ms": statistics.median(_around(series, p, MEDIAN_WINDOW)) * 1e3,
                "mean_ms": statistics.fmean(_around(series, p, MEAN_WINDOW)) * 1e3,
            }
            for p in sizes.positions
            if p + MEAN_WINDOW <= len(series)
        }
    first = str(sizes.positions[0])
    ratio = {}
    for name, row in rows.items():
        final = str(max(int(p) for p in row))
        ratio[name] = {
            "position": int(final),
            "median": row[final]["median_ms"] / row[first]["median_ms"],
            "mean": row[final]["mean_ms"] / row[first]["mean_ms"],
        }
    return {
        "positions": list(sizes.positions),
        "compact_above_events": sizes.compact_above_events,
        "latency": rows,
        "ratio_last_over_first": ratio,
        "journals": journals,
        "goal": {"with compaction, last / first (median)": GOAL, "met": ratio["with"]["median"] <= GOAL},
        "elapsed_s": elapsed,
    }


def print_report(result: dict[str, Any], out: Any) -> None:
    positions = result["positions"]
    print(
        f"\nturn cost, one chat session per host (--compact-above-events {result['compact_above_events']} "
        "on one of them), turns alternated",
        file=out,
    )
    header = " | ".join(f"turn {p:,}" for p in positions)
    print(f"| host | {header} | last / first |", file=out)
    for name in ("without", "with"):
        row = result["latency"][name]
        cells = " | ".join(
            f"{row[str(p)]['median_ms']:.2f} ms ({row[str(p)]['mean_ms']:.2f})"
            if str(p) in row
            else "not run"
            for p in positions
        )
        ratio = result["ratio_last_over_first"][name]
        at = f"turn {ratio['position']:,}"
        print(
            f"| {name} compaction | {cells} | {at}: {ratio['median']:.2f} ({ratio['mean']:.2f}) |", file=out
        )
    for name, journal in result["journals"].items():
        print(
            f"{name} compaction: {journal['records']:,} records, {journal['baselines']} baselines", file=out
        )
    verdict = "met" if result["goal"]["met"] else "missed"
    print(
        f"goal: with compaction, turn {positions[-1]:,} <= {GOAL} x turn {positions[0]}: {verdict}", file=out
    )


def run(*, quick: bool, out: Path = RESULTS, without_until: int = 0) -> int:
    sizes = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="bench-compaction-") as tmp:
        result = measure(sizes, Path(tmp), sys.stderr, without_until)
    result["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count()}
    result["quick"] = quick
    print_report(result, sys.stdout)
    if not quick:
        out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compaction", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="turn 100, not 10,000: a smoke run")
    parser.add_argument(
        "--without-until",
        type=int,
        default=0,
        metavar="TURN",
        help="stop the session without compaction after this turn (its turn 10,000 alone takes ~40 min)",
    )
    args = parser.parse_args(argv)
    return run(quick=args.quick, without_until=args.without_until)


if __name__ == "__main__":
    sys.exit(main())
