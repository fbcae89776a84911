"""The client process of the turn benchmarks: drives echo turns through ``Sessions.Exec``.

The same program drives the protocol floor and the durable host, so both are measured through
the same client stack. ``turns`` runs ``--sessions`` sessions concurrently, each doing turns one
after another (``--warmup`` untimed turns each, then timed ones until ``--seconds`` pass or
``--turns`` are done), and prints one JSON object: turns, elapsed seconds, turns/s, updates per
turn, the client's own CPU seconds over the timed turns, and with ``--latencies`` every timed
turn's latency in order. ``exec`` runs one turn with a
given config (the model round-trip benchmark's trigger). ``flat`` times every turn of one long
session, with a fresh session's turns alternated into its last ones (the flatness benchmark).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

import grpc

from agentsessions.v1 import common_pb2, session_pb2, session_pb2_grpc

EVENT_END: Final = common_pb2.EVENT_END
PROMPT: Final = "hi"


class TurnFailedError(Exception):
    """An Exec stream ended without a COMPLETED END record."""


@dataclass
class SessionLoad:
    uid: str
    latencies: list[float] = field(default_factory=list)
    updates: int = 0


def _request(uid: str, config: bytes = b"") -> session_pb2.ExecRequest:
    text = common_pb2.Part(text=common_pb2.TextPart(text=PROMPT))
    return session_pb2.ExecRequest(
        session=uid, inputs=[common_pb2.Message(role="user", parts=[text])], config=config
    )


async def turn(stub: session_pb2_grpc.SessionsAsyncStub, uid: str, config: bytes = b"") -> int:
    """One Exec, drained; returns how many updates it streamed."""
    updates = 0
    last: common_pb2.LogRecord | None = None
    async for update in stub.Exec(_request(uid, config)):
        updates += 1
        if update.HasField("record"):
            last = update.record
    if last is None or last.event.kind != EVENT_END or last.event.end.state != "COMPLETED":
        raise TurnFailedError(f"session {uid}: the turn did not end COMPLETED")
    return updates


async def _create(stub: session_pb2_grpc.SessionsAsyncStub, harness: str) -> str:
    created = await stub.CreateSession(
        session_pb2.CreateSessionRequest(session=session_pb2.Session(harness=harness))
    )
    uid: str = created.metadata.uid
    return uid


async def run_turns(
    target: str, harness: str, sessions: int, warmup: int, seconds: float, max_turns: int, keep: bool
) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = cast("session_pb2_grpc.SessionsAsyncStub", session_pb2_grpc.SessionsStub(channel))
        loads = [SessionLoad(await _create(stub, harness)) for _ in range(sessions)]
        await asyncio.gather(*(_warm(stub, load.uid, warmup) for load in loads))
        began = time.perf_counter()
        cpu_began = own_cpu()
        deadline = began + seconds

        async def drive(load: SessionLoad) -> None:
            while len(load.latencies) < max_turns and time.perf_counter() < deadline:
                t0 = time.perf_counter()
                load.updates += await turn(stub, load.uid)
                load.latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(drive(load) for load in loads))
        elapsed = time.perf_counter() - began
        cpu = own_cpu() - cpu_began
    done = sum(len(load.latencies) for load in loads)
    result: dict[str, Any] = {
        "sessions": sessions,
        "turns": done,
        "elapsed_s": elapsed,
        "turns_per_s": done / elapsed if elapsed > 0 else 0.0,
        "cpu_s": cpu,
        "updates_per_turn": sum(load.updates for load in loads) / done if done else 0.0,
    }
    if keep:
        result["latencies"] = [load.latencies for load in loads]
    return result


def own_cpu() -> float:
    """User + system CPU seconds this process has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _warm(stub: session_pb2_grpc.SessionsAsyncStub, uid: str, turns: int) -> None:
    for _ in range(turns):
        await turn(stub, uid)


async def run_flat(target: str, harness: str, late: int, fresh: int) -> dict[str, Any]:
    """Latency of every turn of one session of ``late`` turns; over its last ``fresh`` turns a
    fresh session's turns alternate with it, so both are timed under the same machine load."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = cast("session_pb2_grpc.SessionsAsyncStub", session_pb2_grpc.SessionsStub(channel))
        long, short = SessionLoad(await _create(stub, harness)), SessionLoad(await _create(stub, harness))

        async def timed(load: SessionLoad) -> None:
            t0 = time.perf_counter()
            load.updates += await turn(stub, load.uid)
            load.latencies.append(time.perf_counter() - t0)

        while len(long.latencies) < late - fresh:
            await timed(long)
        while len(long.latencies) < late:
            await timed(short)
            await timed(long)
    return {"session": long.latencies, "fresh": short.latencies}


async def run_exec(target: str, harness: str, config: str) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = cast("session_pb2_grpc.SessionsAsyncStub", session_pb2_grpc.SessionsStub(channel))
        uid = await _create(stub, harness)
        t0 = time.perf_counter()
        updates = await turn(stub, uid, config.encode())
        return {"updates": updates, "elapsed_s": time.perf_counter() - t0}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.turn_client")
    sub = parser.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("turns")
    t.add_argument("--target", required=True)
    t.add_argument("--harness", default="")
    t.add_argument("--sessions", type=int, default=1)
    t.add_argument("--warmup", type=int, default=3)
    t.add_argument("--seconds", type=float, default=5.0)
    t.add_argument("--turns", type=int, default=1_000_000, help="at most this many timed turns per session")
    t.add_argument("--latencies", action="store_true")
    f = sub.add_parser("flat")
    f.add_argument("--target", required=True)
    f.add_argument("--harness", default="")
    f.add_argument("--turns", type=int, required=True, help="turns of the long session")
    f.add_argument("--fresh", type=int, required=True, help="turns of the fresh session, alternated")
    e = sub.add_parser("exec")
    e.add_argument("--target", required=True)
    e.add_argument("--harness", default="")
    e.add_argument("--config", default="")
    args = parser.parse_args(argv)
    if args.mode == "turns":
        result = asyncio.run(
            run_turns(
                args.target,
                args.harness,
                args.sessions,
                args.warmup,
                args.seconds,
                args.turns,
                args.latencies,
            )
        )
    elif args.mode == "flat":
        result = asyncio.run(run_flat(args.target, args.harness, args.turns, args.fresh))
    else:
        result = asyncio.run(run_exec(args.target, args.harness, args.config))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
