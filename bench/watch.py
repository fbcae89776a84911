"""Watch benchmarks: what following a session costs, against baselines measured in the same run.

``python -m bench.watch [--quick] [--watchers 100] [--turns 200] [--records 20000]``

Real processes talking gRPC over loopback: ``agentsessions serve`` (SQLite journal, FULL, built-in
echo harness and model), the Exec caller (this process) and the watchers (a process of their own,
so their work does not slow the caller's event loop; both stamp arrivals with CLOCK_MONOTONIC,
which one machine's processes share).

* **fan-out**: ``--watchers`` watchers follow one session while the caller runs ``--turns`` echo
  turns through Exec, back to back. For every record and every watcher, the added latency is the
  time the watcher received it minus the time the Exec caller received it (negative when the
  watcher was first). Baselines in the same run: the same with one watcher, and the caller's
  turns/s with no watcher at all (what the fan-out costs the turn itself).
* **catch-up**: a session of ``--records`` stored records is watched from seq 0 without follow:
  records/s delivered to the watcher, against reading the journal directly (``store.read`` on the
  SQLite file in this process) and against ``Sessions.Replay`` over the same gRPC transport.
* **cross-replica** (when PostgreSQL is reachable: ``AGENTSESSIONS_BENCH_PG_URL``, else a
  throwaway cluster from ``scripts/pg-test-cluster.sh`` when its binaries are installed): two hosts
  on one database; the caller runs turns on host A while one watcher follows on host B (LISTEN/
  NOTIFY) and one on host A; the latency B adds against A's own watcher, per record.

Results go to bench/results/watch.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import grpc
from grpc import aio

from agentsessions.ext.v1 import live_pb2, live_pb2_grpc
from agentsessions.v1 import common_pb2, session_pb2, session_pb2_grpc
from bench import resultfile
from bench.turns import free_port

ROOT: Final = Path(__file__).resolve().parent.parent
RESULTS: Final = ROOT / "bench" / "results" / "watch.json"
BIN: Final = Path(sys.executable).parent
START_TIMEOUT_S: Final = 60.0
PG_URL_ENV: Final = "AGENTSESSIONS_BENCH_PG_URL"
RECORDS_PER_TURN: Final = 5
# Watch streams per channel in the watcher process (HTTP/2 multiplexes them).
STREAMS_PER_CHANNEL: Final = 25
K: Final = common_pb2.EventKind


class Host:
    """``agentsessions serve`` on a journal, on a fixed loopback port."""

    def __init__(self, journal: str, workdir: Path, name: str) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        self.journal = journal
        self.log = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Host:
        argv = [str(BIN / "agentsessions"), "serve", "--listen", self.address, "--journal", self.journal]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        with grpc.insecure_channel(self.address) as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=START_TIMEOUT_S)
            except grpc.FutureTimeoutError:
                raise RuntimeError(f"host did not start (see {self.log})") from None
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _text(text: str) -> common_pb2.Message:
    return common_pb2.Message(role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text=text))])


async def _create(address: str) -> str:
    async with aio.insecure_channel(address) as channel:
        stub = session_pb2_grpc.SessionsStub(channel)
        session = await stub.CreateSession(
            session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="echo"))
        )
    return str(session.metadata.uid)


async def _run_turns(address: str, uid: str, turns: int) -> tuple[dict[int, int], float]:
    """Turns back to back through Exec: the arrival time (ns) of each record, and turns/s."""
    arrivals: dict[int, int] = {}
    async with aio.insecure_channel(address) as channel:
        stub = session_pb2_grpc.SessionsStub(channel)
        began = time.perf_counter()
        for n in range(turns):
            async for update in stub.Exec(session_pb2.ExecRequest(session=uid, inputs=[_text(f"turn {n}")])):
                if update.WhichOneof("update") == "record":
                    arrivals[update.record.seq] = time.monotonic_ns()
        elapsed = time.perf_counter() - began
    return arrivals, turns / elapsed


# -- the watcher process --------------------------------------------------------------------------


async def _watchers(address: str, uid: str, count: int, last_seq: int, ready: Any) -> list[dict[int, int]]:
    channels = [aio.insecure_channel(address) for _ in range(max(1, -(-count // STREAMS_PER_CHANNEL)))]
    subscribed = 0

    async def follow(index: int) -> dict[int, int]:
        nonlocal subscribed
        stub = live_pb2_grpc.LiveSessionsStub(channels[index % len(channels)])
        seen: dict[int, int] = {}
        async for update in stub.Watch(live_pb2.WatchRequest(session=uid, follow=True)):
            if update.HasField("session") and not seen:
                subscribed += 1
                if subscribed == count:
                    ready.set()
            if update.HasField("record"):
                seen[update.record.seq] = time.monotonic_ns()
                if update.record.seq >= last_seq:
                    return seen
        return seen

    try:
        return list(await asyncio.gather(*(follow(i) for i in range(count))))
    finally:
        for channel in channels:
            await channel.close()


def _watcher_process(address: str, uid: str, count: int, last_seq: int, ready: Any, out: Any) -> None:
    out.put(asyncio.run(_watchers(address, uid, count, last_seq, ready)))


@contextlib.contextmanager
def watching(address: str, uid: str, count: int, last_seq: int) -> Iterator[Any]:
    """``count`` watchers in a process of their own; yields a queue that receives, once they saw
    ``last_seq``, each watcher's arrival times."""
    context = multiprocessing.get_context("spawn")
    ready, out = context.Event(), context.Queue()
    process = context.Process(target=_watcher_process, args=(address, uid, count, last_seq, ready, out))
    process.start()
    try:
        if not ready.wait(START_TIMEOUT_S):
            raise RuntimeError("the watchers did not subscribe in time")
        yield out
    finally:
        process.join(timeout=120)
        if process.is_alive():
            process.kill()


# -- fan-out ----------------------------------------------------------------------------------------


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}

    def at(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * (len(ordered) - 1) + 0.5))]

    return {
        "p50_ms": at(0.50),
        "p95_ms": at(0.95),
        "p99_ms": at(0.99),
        "max_ms": ordered[-1],
        "mean_ms": statistics.fmean(ordered),
        "samples": float(len(ordered)),
    }


def _added(caller: dict[int, int], watchers: list[dict[int, int]]) -> list[float]:
    return [(seen[seq] - at) / 1e6 for seen in watchers for seq, at in caller.items() if seq in seen]


def fan_out(address: str, watchers: int, turns: int) -> dict[str, Any]:
    last = turns * RECORDS_PER_TURN
    uid = asyncio.run(_create(address))
    _, alone = asyncio.run(_run_turns(address, uid, turns))  # baseline: no watcher at all
    out: dict[str, Any] = {"turns": turns, "watchers": watchers, "turns_per_s_without_watchers": alone}
    for count in (1, watchers):
        uid = asyncio.run(_create(address))
        with watching(address, uid, count, last) as results:
            caller, rate = asyncio.run(_run_turns(address, uid, turns))
            seen: list[dict[int, int]] = results.get(timeout=120)
        complete = all(len(s) == last for s in seen)
        out[f"{count}_watchers"] = {
            "turns_per_s": rate,
            "every_record_delivered": complete,
            "added_latency": _percentiles(_added(caller, seen)),
        }
    return out


# -- catch-up -----------------------------------------------------------------------------------------


async def _fill(journal: Path, records: int) -> str:
    """A session of ``records`` stored records, appended straight to the journal file."""
    from agentsessions.host.journal.sqlite import SqliteStore
    from agentsessions.host.journal.store import SessionRow

    store = await SqliteStore.open(journal)
    try:
        uid = "sess-" + os.urandom(12).hex()
        await store.create_session(SessionRow(uid=uid, project="default", harness="echo"))
        head, batch = 0, 500
        while head < records:
            n = min(batch, records - head)
            events = [
                common_pb2.Event(kind=K.EVENT_OUTPUT, message=_text(f"record {head + i + 1} " + "x" * 60))
                for i in range(n)
            ]
            await store.append(uid, events, expected_head=head, fence=1, mint_fence=head == 0)
            head += n
        return uid
    finally:
        await store.close()


async def _read_directly(journal: Path, uid: str) -> tuple[int, float]:
    from agentsessions.host.journal.sqlite import SqliteStore

    store = await SqliteStore.open(journal)
    try:
        began = time.perf_counter()
        count = len(await store.read(uid))
        return count, count / (time.perf_counter() - began)
    finally:
        await store.close()


async def _over_grpc(address: str, uid: str, how: str) -> tuple[int, float]:
    async with aio.insecure_channel(
        address, options=(("grpc.max_receive_message_length", 64 << 20),)
    ) as channel:
        began = time.perf_counter()
        count = 0
        if how == "watch":
            stub = live_pb2_grpc.LiveSessionsStub(channel)
            async for update in stub.Watch(live_pb2.WatchRequest(session=uid, follow=False)):
                count += update.HasField("record")
        else:
            async for _ in session_pb2_grpc.SessionsStub(channel).Replay(
                session_pb2.ReplayRequest(session=uid)
            ):
                count += 1
        return count, count / (time.perf_counter() - began)


def catch_up(address: str, journal: Path, uid: str, rounds: int) -> dict[str, Any]:
    best: dict[str, float] = {}
    counts: dict[str, int] = {}
    for _ in range(rounds):
        for name in ("direct_read", "replay_rpc", "watch_rpc"):
            if name == "direct_read":
                count, rate = asyncio.run(_read_directly(journal, uid))
            else:
                count, rate = asyncio.run(_over_grpc(address, uid, name.removesuffix("_rpc")))
            counts[name] = count
            best[name] = max(best.get(name, 0.0), rate)
    return {
        "records": counts["direct_read"],
        "all_delivered": len(set(counts.values())) == 1,
        "records_per_s": best,
        "watch_over_direct_read": best["watch_rpc"] / best["direct_read"],
        "watch_over_replay_rpc": best["watch_rpc"] / best["replay_rpc"],
    }


# -- cross-replica ------------------------------------------------------------------------------------


@contextlib.contextmanager
def postgres(workdir: Path) -> Iterator[str | None]:
    """A PostgreSQL URL to measure on (a scratch database), or None when there is none."""
    url = os.environ.get(PG_URL_ENV, "").strip()
    cluster: Path | None = None
    if not url:
        script = ROOT / "scripts" / "pg-test-cluster.sh"
        if subprocess.run([str(script), "bindir"], capture_output=True, check=False).returncode != 0:
            yield None
            return
        # A directory of its own under /tmp, which the unprivileged server account can reach.
        cluster = Path(tempfile.mkdtemp(prefix="agentsessions-bench-pg-", dir="/tmp"))
        started = subprocess.run(
            [str(script), "start", str(cluster), "--durable"], capture_output=True, text=True, check=False
        )
        if started.returncode != 0:
            yield None
            return
        url = started.stdout.strip().splitlines()[-1]
    try:
        yield asyncio.run(_scratch(url))
    finally:
        if cluster is not None:
            subprocess.run([str(ROOT / "scripts" / "pg-test-cluster.sh"), "stop", str(cluster)], check=False)
            shutil.rmtree(cluster, ignore_errors=True)


async def _scratch(admin_url: str) -> str:
    from bench.journal import create_scratch_database  # not at the top: watcher processes import this module

    return await create_scratch_database(admin_url, "agentsessions_bench_watch_" + os.urandom(6).hex())


def cross_replica(url: str, workdir: Path, turns: int) -> dict[str, Any]:
    last = turns * RECORDS_PER_TURN
    with Host(url, workdir, "replica-a") as a, Host(url, workdir, "replica-b") as b:
        uid = asyncio.run(_create(a.address))
        with watching(a.address, uid, 1, last) as same_host, watching(b.address, uid, 1, last) as other_host:
            caller, rate = asyncio.run(_run_turns(a.address, uid, turns))
            on_a: list[dict[int, int]] = same_host.get(timeout=120)
            on_b: list[dict[int, int]] = other_host.get(timeout=120)
    across = [(on_b[0][seq] - on_a[0][seq]) / 1e6 for seq in on_a[0] if seq in on_b[0]]
    return {
        "turns": turns,
        "turns_per_s": rate,
        "every_record_delivered": len(on_a[0]) == len(on_b[0]) == last,
        "watcher_on_a_after_caller": _percentiles(_added(caller, on_a)),
        "watcher_on_b_after_caller": _percentiles(_added(caller, on_b)),
        "watcher_on_b_after_watcher_on_a": _percentiles(across),
    }


# -- report --------------------------------------------------------------------------------------------


def _row(name: str, stats: dict[str, float]) -> str:
    if not stats:
        return f"  {name:<44} (no samples)"
    return (
        f"  {name:<44} p50 {stats['p50_ms']:7.2f}  p95 {stats['p95_ms']:7.2f}  "
        f"p99 {stats['p99_ms']:7.2f}  max {stats['max_ms']:7.2f}  ({int(stats['samples'])} samples)"
    )


def _print(report: dict[str, Any]) -> None:
    fan = report["fan_out"]
    print(f"\nwatch fan-out: {fan['turns']} echo turns, added latency per record vs the Exec caller (ms)")
    for count in (1, fan["watchers"]):
        part = fan[f"{count}_watchers"]
        print(_row(f"{count} watcher(s)", part["added_latency"]))
    print(
        f"  turns/s of the caller: {fan['turns_per_s_without_watchers']:.1f} with no watcher, "
        f"{fan['1_watchers']['turns_per_s']:.1f} with 1, "
        f"{fan[str(fan['watchers']) + '_watchers']['turns_per_s']:.1f} with {fan['watchers']}"
    )
    up = report["catch_up"]
    rates = up["records_per_s"]
    print(f"\nwatch catch-up: {up['records']} stored records, from seq 0 (records/s, best of the rounds)")
    print(f"  reading the journal directly  {rates['direct_read']:12,.0f}")
    print(f"  Sessions.Replay over gRPC     {rates['replay_rpc']:12,.0f}")
    print(f"  LiveSessions.Watch over gRPC  {rates['watch_rpc']:12,.0f}")
    print(
        f"  watch / direct read {up['watch_over_direct_read']:.2f}, "
        f"watch / Replay {up['watch_over_replay_rpc']:.2f}"
    )
    cross = report.get("cross_replica")
    if cross is None:
        print(f"\ncross-replica: not measured ({report.get('cross_replica_skipped')})")
    else:
        print(f"\ncross-replica (PostgreSQL, LISTEN/NOTIFY): {cross['turns']} turns on host A (ms)")
        print(_row("watcher on A after the caller", cross["watcher_on_a_after_caller"]))
        print(_row("watcher on B after the caller", cross["watcher_on_b_after_caller"]))
        print(_row("watcher on B after the watcher on A", cross["watcher_on_b_after_watcher_on_a"]))


def run(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.watch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--watchers", type=int, default=100)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not a measurement")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(list(argv))
    if args.quick:
        args.watchers, args.turns, args.records, args.rounds = 10, 20, 2_000, 1
    report: dict[str, Any] = {
        "benchmark": "watch",
        "when_unix": int(time.time()),
        "machine": resultfile.machine(),
        "quick": args.quick,
    }
    with tempfile.TemporaryDirectory(prefix="agentsessions-bench-watch-") as tmp:
        workdir = Path(tmp)
        journal = workdir / "journal.db"
        uid = asyncio.run(_fill(journal, args.records))
        with Host(str(journal), workdir, "host") as host:
            report["fan_out"] = fan_out(host.address, args.watchers, args.turns)
            report["catch_up"] = catch_up(host.address, journal, uid, args.rounds)
        with postgres(workdir) as url:
            if url is None:
                report["cross_replica_skipped"] = f"no PostgreSQL: set {PG_URL_ENV} or install its binaries"
            else:
                report["cross_replica"] = cross_replica(url, workdir, args.turns)
    _print(report)
    resultfile.write(args.out, report, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
