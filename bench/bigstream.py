"""A big streamed output beside small sessions: what one session's long answer costs the others.

``agentsessions serve`` runs as shipped (SQLite journal, the built-in echo harness and echo model,
which streams its reply 8 characters at a time). Small sessions do one-word turns back to back,
first alone and then while one more session sends a big input (``--big-bytes``, 1 MB), so the echo
model streams a 1 MB answer; the two phases alternate ``rounds`` times. Reported: the small
turns' median, p99 and worst latency in each phase (the ratio beside/alone is the measure: one
session's stream should not delay another's turns), and how many Delta frames a big turn
streamed (the host batches streamed text into frames of up to 1 KiB: issue #15 item 3; before
that, one frame per 8 characters).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, cast

import grpc

from agentsessions.sdk.limits import MESSAGE_SIZE_OPTIONS
from agentsessions.v1 import common_pb2, session_pb2, session_pb2_grpc
from bench import resultfile
from bench.turns import fleet

ROOT: Final = Path(__file__).resolve().parent.parent
RESULTS: Final = ROOT / "bench" / "results" / "bigstream.json"


@dataclass(frozen=True)
class Sizes:
    small_sessions: int
    seconds: float  # one phase
    rounds: int
    big_bytes: int


FULL: Final = Sizes(small_sessions=4, seconds=6.0, rounds=2, big_bytes=1_000_000)
QUICK: Final = Sizes(small_sessions=2, seconds=1.5, rounds=1, big_bytes=200_000)


@dataclass
class Phase:
    small_s: list[float] = field(default_factory=list)  # every small turn's latency
    big_s: list[float] = field(default_factory=list)
    big_frames: list[int] = field(default_factory=list)  # Delta frames per big turn


def _request(uid: str, text: str) -> session_pb2.ExecRequest:
    part = common_pb2.Part(text=common_pb2.TextPart(text=text))
    return session_pb2.ExecRequest(session=uid, inputs=[common_pb2.Message(role="user", parts=[part])])


async def _turn(stub: session_pb2_grpc.SessionsAsyncStub, uid: str, text: str) -> int:
    """One Exec, drained; the Delta frames it streamed."""
    frames = 0
    ended = ""
    async for update in stub.Exec(_request(uid, text)):
        if update.HasField("delta"):
            frames += 1
        elif update.HasField("record") and update.record.event.kind == common_pb2.EVENT_END:
            ended = update.record.event.end.state
    if ended != "COMPLETED":
        raise RuntimeError(f"session {uid}: the turn ended {ended or 'without END'}")
    return frames


async def _phase(
    stub: session_pb2_grpc.SessionsAsyncStub, small: list[str], big: str | None, sizes: Sizes
) -> Phase:
    phase = Phase()
    deadline = time.perf_counter() + sizes.seconds
    stop = asyncio.Event()

    async def small_loop(uid: str) -> None:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            await _turn(stub, uid, "hi")
            phase.small_s.append(time.perf_counter() - t0)

    async def big_loop(uid: str) -> None:
        text = "x" * sizes.big_bytes
        while not stop.is_set():
            t0 = time.perf_counter()
            phase.big_frames.append(await _turn(stub, uid, text))
            phase.big_s.append(time.perf_counter() - t0)

    bigger = asyncio.create_task(big_loop(big)) if big is not None else None
    try:
        await asyncio.gather(*(small_loop(uid) for uid in small))
    finally:
        stop.set()
        if bigger is not None:
            await bigger  # the big turn in flight ends by itself; its frames count
    return phase


async def _measure(target: str, sizes: Sizes) -> dict[str, Phase]:
    phases = {"alone": Phase(), "beside": Phase()}
    async with grpc.aio.insecure_channel(target, options=MESSAGE_SIZE_OPTIONS) as channel:
        stub = cast("session_pb2_grpc.SessionsAsyncStub", session_pb2_grpc.SessionsStub(channel))

        async def create() -> str:
            created = await stub.CreateSession(
                session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="echo"))
            )
            return str(created.metadata.uid)

        small = [await create() for _ in range(sizes.small_sessions)]
        big = await create()
        for uid in small:
            await _turn(stub, uid, "warm")
        for _ in range(sizes.rounds):
            for name, with_big in (("alone", None), ("beside", big)):
                got = await _phase(stub, small, with_big, sizes)
                phases[name].small_s += got.small_s
                phases[name].big_s += got.big_s
                phases[name].big_frames += got.big_frames
    return phases


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(*, quick: bool, sizes: Sizes | None = None, out: Path = RESULTS) -> int:
    sizes = sizes or (QUICK if quick else FULL)
    with tempfile.TemporaryDirectory(prefix="agentsessions-bench-bigstream-") as tmp, fleet(Path(tmp)) as f:
        target = f.host("host", str(Path(tmp) / "journal.db"), {})
        phases = asyncio.run(_measure(target, sizes))
    summary: dict[str, Any] = {}
    print(
        f"\nbig output beside small sessions ({sizes.small_sessions} small sessions, "
        f"big input {sizes.big_bytes:,} B)"
    )
    for name, phase in phases.items():
        row = {
            "small_turns": len(phase.small_s),
            "small_p50_s": statistics.median(phase.small_s),
            "small_p99_s": _p(phase.small_s, 0.99),
            "small_max_s": max(phase.small_s),
        }
        if phase.big_frames:
            row["big_turns"] = len(phase.big_frames)
            row["big_frames_per_turn"] = statistics.median(phase.big_frames)
            row["big_turn_s"] = statistics.median(phase.big_s)
        summary[name] = row
        line = (
            f"  {name:<7} small turns: p50 {row['small_p50_s'] * 1e3:7.1f} ms"
            f"  p99 {row['small_p99_s'] * 1e3:7.1f} ms"
            f"  max {row['small_max_s'] * 1e3:7.1f} ms  ({row['small_turns']} turns)"
        )
        if phase.big_frames:
            line += (
                f"; big turns: {row['big_turns']}, {row['big_frames_per_turn']:.0f} Delta frames each,"
                f" {row['big_turn_s']:.2f} s"
            )
        print(line)
    ratio = summary["beside"]["small_p99_s"] / summary["alone"]["small_p99_s"]
    print(f"  small p99 beside a big stream / alone: {ratio:.2f}x")
    document = {
        "suite": "bigstream",
        "quick": quick,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": resultfile.machine(),
        "sizes": sizes.__dict__,
        "phases": summary,
        "small_p99_beside_over_alone": ratio,
    }
    resultfile.write(out, document)
    with contextlib.suppress(ValueError):
        print(f"wrote {out.relative_to(ROOT)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bigstream", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--big-bytes", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.big_bytes is not None:
        sizes = Sizes(sizes.small_sessions, sizes.seconds, sizes.rounds, args.big_bytes)
    return run(quick=args.quick, sizes=sizes, out=args.out)


if __name__ == "__main__":
    sys.exit(main())
