"""Load: many sessions turning at once on one host, with and without readers beside them.

``python -m bench.load [--sessions 200] [--seconds 60] [--replay 20] [--list 20] [--watch 20] [--quick]``
(``python -m bench load`` runs it with the defaults; it is not part of the default ``make bench``).

Two phases, each on a fresh ``agentsessions serve`` (SQLite journal, synchronous=FULL as shipped,
built-in echo harness and model) over loopback, measured in the same run:

* **turns only**: ``--sessions`` sessions, each running echo turns back to back for ``--seconds``;
* **turns + readers**: the same turn load, plus reader callers in a separate process: ``--replay``
  callers each replaying a random session's whole journal, ``--list`` callers each paging
  ``ListSessions`` (page of 100) through every session, and ``--watch`` callers following a random
  session live with ``LiveSessions.Watch`` (only where the host serves it). Each reader waits
  ``--think`` seconds between its calls, the way a dashboard or an operator's script polls, and
  makes its first call at a random moment of its first think, as independent callers do;
  ``--lockstep`` starts them all at once instead, so every second brings a burst of 20 calls.

Reported per phase: turns/s, turn latency p50/p99, every error by status code (turns and readers),
reader latency p50/p99 per kind, the same calls' time in the host's handlers (p50/p99 from its access
log: a caller's latency less the wait before the host's code sees the call and the way back), the
host's peak RSS and open file descriptors (from /proc), and where the machine's CPU went over the
window, in cores (CPU seconds a second): the host, the turns' client, each reader process and the
whole machine, with the host's CPU a turn. After each phase the host drains and stops, then the
journal is verified offline (``agentsessions journal verify``) and every execution in it is checked
complete (an END record). The goals (reliability issue): 0 errors, turns/s with readers within 20%
of turns only, ListSessions p99 under 100 ms.

Two controls follow the goals, because the machine itself has slow spells that slow every process
alike by up to a third: the readers phase's mean pace over the turns-only phase's (the pace is the
CPU a fixed piece of work takes, ``bench.resultfile``, sampled every second in both phases), and
the slowdown counted again over only the 2-second windows of both phases in which the machine kept
its usual pace (``steady_turns``).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import random
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc
from grpc import aio

from agentsessions.v1 import common_pb2, session_pb2, session_pb2_grpc
from bench import resultfile
from bench.turn_client import own_cpu
from bench.turns import ROOT, Fleet, cpu_seconds, fleet, verify_journal

RESULTS: Final = ROOT / "bench" / "results" / "load.json"
GOAL_READER_SLOWDOWN: Final = 0.20
GOAL_LIST_P99_S: Final = 0.100
LIST_PAGE: Final = 100
CALL_TIMEOUT_S: Final = 60.0
CHANNELS: Final = 4
WARMUP_TURNS: Final = 2


@dataclass
class Calls:
    """Latencies of the calls that succeeded and the status codes of those that did not."""

    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def took(self, seconds: float) -> None:
        self.latencies.append(seconds)

    def failed(self, code: grpc.StatusCode | None) -> None:
        self.errors[code.name if code is not None else "TRANSPORT"] += 1

    def summary(self) -> dict[str, Any]:
        return {
            "calls": len(self.latencies),
            "p50_ms": _percentile(self.latencies, 0.50) * 1000,
            "p90_ms": _percentile(self.latencies, 0.90) * 1000,
            "p95_ms": _percentile(self.latencies, 0.95) * 1000,
            "p99_ms": _percentile(self.latencies, 0.99) * 1000,
            "errors": dict(self.errors),
        }


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _text(text: str) -> common_pb2.Message:
    return common_pb2.Message(role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text=text))])


# -- the turn load (this process) ---------------------------------------------------------------


async def _create_sessions(stubs: Sequence[session_pb2_grpc.SessionsStub], count: int) -> list[str]:
    async def one(i: int) -> str:
        stub = stubs[i % len(stubs)]
        request = session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="echo"))
        session = await stub.CreateSession(request, timeout=CALL_TIMEOUT_S)
        return str(session.metadata.uid)

    uids: list[str] = []
    for start in range(0, count, 50):
        uids += await asyncio.gather(*(one(i) for i in range(start, min(count, start + 50))))
    return uids


async def _turns(
    stub: session_pb2_grpc.SessionsStub,
    uid: str,
    until: float,
    calls: Calls,
    started: list[float],
    *,
    limit: int = 0,
) -> None:
    n = 0
    while time.monotonic() < until and not (limit and n >= limit):
        n += 1
        began = time.monotonic()
        try:
            call = stub.Exec(
                session_pb2.ExecRequest(session=uid, inputs=[_text(f"turn {n}")]), timeout=CALL_TIMEOUT_S
            )
            async for _ in call:
                pass
        except aio.AioRpcError as exc:
            calls.failed(exc.code())
            continue
        calls.took(time.monotonic() - began)
        started.append(began)


async def _sample(pid: int, stop: asyncio.Event, peak: dict[str, int]) -> None:
    """Peak RSS (KiB) and open descriptors of the host, once a second."""
    while not stop.is_set():
        usage = _usage(pid)
        if usage is None:
            return
        peak["rss_kib"] = max(peak.get("rss_kib", 0), usage[0])
        peak["fds"] = max(peak.get("fds", 0), usage[1])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=1.0)


def _usage(pid: int) -> tuple[int, int] | None:
    """(RSS in KiB, open descriptors) of a live process, from /proc (tiny reads)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return None


def _machine_busy() -> float:
    """CPU seconds every core of the machine has spent busy (not idle, not waiting on I/O) since
    boot, from the first line of /proc/stat; 0.0 where there is no /proc."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            ticks = [int(value) for value in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    # user nice system idle iowait irq softirq steal ...: everything but idle and iowait.
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


async def _drive(
    address: str, pid: int, args: argparse.Namespace, readers: bool, workdir: Path
) -> dict[str, Any]:
    channels = [aio.insecure_channel(address) for _ in range(CHANNELS)]
    try:
        stubs = [session_pb2_grpc.SessionsStub(channel) for channel in channels]
        uids = await _create_sessions(stubs, args.sessions)
        # Two untimed turns per session first, so both phases start warm.
        warm = Calls()
        warm_until = time.monotonic() + CALL_TIMEOUT_S
        await asyncio.gather(
            *(
                _turns(stubs[i % CHANNELS], uid, warm_until, warm, [], limit=WARMUP_TURNS)
                for i, uid in enumerate(uids)
            )
        )
        uid_file = workdir / "uids.json"
        uid_file.write_text(json.dumps(uids))
        # One process (so one event loop and one connection) per kind of reader: a ListSessions
        # caller's latency is then the host's, not that of 20 replay streams sharing its loop and
        # its HTTP/2 connection, as separate clients would be.
        reader_procs: list[asyncio.subprocess.Process] = []
        if readers:
            for kind in ("replay", "list", "watch"):
                count = getattr(args, kind)
                if count <= 0:
                    continue
                counts = {k: (count if k == kind else 0) for k in ("replay", "list", "watch")}
                reader_procs.append(
                    await asyncio.create_subprocess_exec(
                        sys.executable,
                        "-m",
                        "bench.load",
                        "readers",
                        "--target",
                        address,
                        "--uids",
                        str(uid_file),
                        "--seconds",
                        str(args.seconds),
                        *(f"--{k}={v}" for k, v in counts.items()),
                        "--think",
                        str(args.think),
                        *(["--lockstep"] if args.lockstep else []),
                        cwd=ROOT,
                        env={**os.environ, "PYTHONPATH": str(ROOT)},
                        stdout=asyncio.subprocess.PIPE,
                    )
                )
        calls = Calls()
        started: list[float] = []
        stop = asyncio.Event()
        peak: dict[str, int] = {}
        sampler = asyncio.create_task(_sample(pid, stop, peak))
        began = time.monotonic()
        until = began + args.seconds
        cpu_began = (cpu_seconds(pid), own_cpu(), _machine_busy())
        await asyncio.gather(
            *(_turns(stubs[i % CHANNELS], uid, until, calls, started) for i, uid in enumerate(uids))
        )
        elapsed = time.monotonic() - began
        cpu_ended = (cpu_seconds(pid), own_cpu(), _machine_busy())
        stop.set()
        await sampler
        reader_report: dict[str, Any] = {}
        for proc in reader_procs:
            assert proc.stdout is not None
            out = await asyncio.wait_for(proc.stdout.read(), timeout=args.seconds + CALL_TIMEOUT_S)
            await proc.wait()
            part: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
            # Each process reports every kind; only the kind it ran is its own.
            reader_report.update(
                {k: v for k, v in part.items() if k == "watch" or v["calls"] or v["errors"] or "cpu_s" in v}
            )
        for kind in ("replay", "list"):
            reader_report.setdefault(kind, Calls().summary())
        # Turns that started inside the window, over the window.
        in_window = sum(1 for t in started if t < until)
        host_began, host_ended = cpu_began[0], cpu_ended[0]
        return {
            "sessions": len(uids),
            "seconds": elapsed,
            "turns": calls.summary(),
            "turns_per_s": in_window / args.seconds,
            # The window (time.monotonic()) and when each turn in it started: see steady_turns.
            "window": [began, until],
            "turn_starts": sorted(t for t in started if t < until),
            "host_peak": peak,
            "readers": reader_report,
            # Where the machine's CPU went over the window, in cores (CPU seconds a second): the
            # host, this process (the turns' client), each reader process, and the whole machine.
            "cpu_cores": {
                "host": (host_ended - host_began) / elapsed
                if host_began is not None and host_ended is not None
                else 0.0,
                "turn_client": (cpu_ended[1] - cpu_began[1]) / elapsed,
                **{
                    f"readers_{kind}": reader_report[kind]["cpu_s"] / reader_report[kind]["seconds"]
                    for kind in ("replay", "list", "watch")
                    if reader_report.get(kind, {}).get("seconds")
                },
                "machine": (cpu_ended[2] - cpu_began[2]) / elapsed,
                "cores": os.cpu_count() or 1,
            },
        }
    finally:
        for channel in channels:
            await channel.close()


def _check_journal(journal: Path) -> dict[str, Any]:
    """Offline: the chain verifies, and every execution in the journal has its END."""
    verified = verify_journal(journal)
    incomplete = asyncio.run(_incomplete_executions(journal))
    return {
        "verify_exit": verified.returncode,
        "verify_output": (verified.stdout + verified.stderr).strip().splitlines()[-1:],
        "incomplete_executions": incomplete,
    }


async def _incomplete_executions(journal: Path) -> int:
    from agentsessions.host.journal import open_store

    store = await open_store(str(journal))
    try:
        incomplete = 0
        for uid in await store.session_uids():
            open_ids: set[str] = set()
            for record in await store.read(uid):
                event = record.event
                if event.kind == common_pb2.EVENT_EXECUTION_START:
                    open_ids.add(event.execution_id)
                elif event.kind == common_pb2.EVENT_END:
                    open_ids.discard(event.execution_id)
            incomplete += len(open_ids)
        return incomplete
    finally:
        await store.close()


def _phase(name: str, args: argparse.Namespace, readers: bool, tmp: Path) -> dict[str, Any]:
    workdir = tmp / name
    workdir.mkdir()
    journal = workdir / "journal.db"
    with fleet(workdir) as servers:
        address = _serve(servers, journal)
        pid = servers.pids["host"]
        result = asyncio.run(_drive(address, pid, args, readers, workdir))
    # The host has drained and written its last access-log lines.
    result["in_host"] = _handler_durations(workdir / "host.log")
    result["journal"] = _check_journal(journal)
    return result


_ACCESS_LINE = re.compile(r" rpc method=/agentsessions\.v1\.Sessions/(\w+) code=OK duration_ms=([0-9.]+)")


def _handler_durations(log: Path) -> dict[str, dict[str, float]]:
    """The host's own view of each call, from its access log: from the handler's start to its end
    (the caller's latency adds the wait before the host's code sees the call, and the way back)."""
    durations: dict[str, list[float]] = {}
    with open(log, encoding="utf-8", errors="replace") as lines:
        for line in lines:
            found = _ACCESS_LINE.search(line)
            if found is not None:
                durations.setdefault(found.group(1), []).append(float(found.group(2)) / 1000)
    return {
        method: {
            "calls": len(values),
            "p50_ms": _percentile(values, 0.50) * 1000,
            "p99_ms": _percentile(values, 0.99) * 1000,
        }
        for method, values in durations.items()
        if method in ("Exec", "ListSessions", "Replay")
    }


def _serve(servers: Fleet, journal: Path) -> str:
    return servers.host("host", str(journal), {})


# -- the readers (a child process, so their client CPU does not slow the turn drivers) ----------


async def _replayer(
    stub: session_pb2_grpc.SessionsStub,
    uids: list[str],
    until: float,
    think: float,
    calls: Calls,
    start: float,
) -> None:
    await asyncio.sleep(start)
    while time.monotonic() < until:
        began = time.monotonic()
        try:
            async for _ in stub.Replay(
                session_pb2.ReplayRequest(session=random.choice(uids)), timeout=CALL_TIMEOUT_S
            ):
                pass
            calls.took(time.monotonic() - began)
        except aio.AioRpcError as exc:
            calls.failed(exc.code())
        await asyncio.sleep(think)


async def _lister(
    stub: session_pb2_grpc.SessionsStub, until: float, think: float, calls: Calls, start: float
) -> None:
    await asyncio.sleep(start)
    while time.monotonic() < until:
        token = ""
        while True:
            began = time.monotonic()
            try:
                page = await stub.ListSessions(
                    session_pb2.ListSessionsRequest(page_size=LIST_PAGE, page_token=token),
                    timeout=CALL_TIMEOUT_S,
                )
            except aio.AioRpcError as exc:
                calls.failed(exc.code())
                break
            calls.took(time.monotonic() - began)
            token = page.next_page_token
            if not token or time.monotonic() >= until:
                break
        await asyncio.sleep(think)


async def _watcher(
    channel: aio.Channel, uids: list[str], until: float, calls: Calls, served: list[bool]
) -> None:
    """Follow one random session live until the window ends; counts records delivered."""
    try:
        from agentsessions.ext.v1 import live_pb2, live_pb2_grpc
    except ImportError:
        served.append(False)
        return
    stub = live_pb2_grpc.LiveSessionsStub(channel)
    call = stub.Watch(live_pb2.WatchRequest(session=random.choice(uids), follow=True))
    try:
        async with asyncio.timeout(max(0.0, until - time.monotonic())):
            async for update in call:
                if update.WhichOneof("update") == "record":
                    calls.took(0.0)
    except TimeoutError:
        call.cancel()
    except aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            served.append(False)
            return
        calls.failed(exc.code())
    served.append(True)


async def _readers(args: argparse.Namespace) -> dict[str, Any]:
    uids: list[str] = args.uid_list
    began, cpu_began = time.monotonic(), own_cpu()
    until = began + args.seconds
    channel = aio.insecure_channel(args.target)
    try:
        stub = session_pb2_grpc.SessionsStub(channel)
        replays, lists, watches = Calls(), Calls(), Calls()
        served: list[bool] = []

        def start() -> float:
            # Independent callers start at unrelated moments; "lockstep" starts them together,
            # and as each pass takes about as long as the others they stay together.
            return 0.0 if args.lockstep else random.uniform(0.0, args.think)

        await asyncio.gather(
            *(_replayer(stub, uids, until, args.think, replays, start()) for _ in range(args.replay)),
            *(_lister(stub, until, args.think, lists, start()) for _ in range(args.list)),
            *(_watcher(channel, uids, until, watches, served) for _ in range(args.watch)),
        )
        report = {"replay": replays.summary(), "list": lists.summary()}
        if args.watch:
            watched = watches.summary()
            report["watch"] = {
                "served": bool(served) and all(served),
                "records_delivered": watched["calls"],
                "errors": watched["errors"],
            }
        # This process runs one kind of reader: its CPU over its run is that kind's.
        ran = next((kind for kind in ("replay", "list", "watch") if getattr(args, kind)), None)
        if ran is not None:
            report[ran] |= {"cpu_s": own_cpu() - cpu_began, "seconds": time.monotonic() - began}
        return report
    finally:
        await channel.close()


# -- report -------------------------------------------------------------------------------------


def _errors(phase: dict[str, Any]) -> int:
    total: int = sum(phase["turns"]["errors"].values())
    for kind in ("replay", "list", "watch"):
        total += sum(phase["readers"].get(kind, {}).get("errors", {}).values())
    return total


def _print(name: str, phase: dict[str, Any]) -> None:
    turns = phase["turns"]
    peak = phase["host_peak"]
    print(f"\n{name}: {phase['sessions']} sessions x {phase['seconds']:.0f} s")
    print(
        f"  turns/s {phase['turns_per_s']:8.1f}   turn p50 {turns['p50_ms']:7.1f} ms"
        f"   p99 {turns['p99_ms']:7.1f} ms   errors {turns['errors'] or 0}"
    )
    for kind in ("replay", "list"):
        reader = phase["readers"].get(kind)
        if reader and reader["calls"]:
            print(
                f"  {kind:7s} calls {reader['calls']:6d}   p50 {reader['p50_ms']:7.1f} ms"
                f"   p99 {reader['p99_ms']:7.1f} ms   errors {reader['errors'] or 0}"
            )
    for method, own in sorted(phase.get("in_host", {}).items()):
        print(
            f"  in the host's handler: {method:12s} p50 {own['p50_ms']:7.1f} ms   p99 {own['p99_ms']:7.1f} ms"
            f"   ({own['calls']} calls)"
        )
    watch = phase["readers"].get("watch")
    if watch:
        shown = (
            "not served by this host"
            if not watch["served"]
            else f"{watch['records_delivered']} records delivered"
        )
        print(f"  watch   {shown}   errors {watch['errors'] or 0}")
    print(f"  host peak RSS {peak.get('rss_kib', 0) / 1024:.0f} MiB, open fds {peak.get('fds', 0)}")
    cores = phase.get("cpu_cores")
    if cores:
        readers = {k.removeprefix("readers_"): v for k, v in cores.items() if k.startswith("readers_")}
        shown = ", ".join(f"{kind} {used:.2f}" for kind, used in readers.items())
        per_turn = cores["host"] / phase["turns_per_s"] * 1000 if phase["turns_per_s"] else 0.0
        print(
            f"  CPU in cores: host {cores['host']:.2f} ({per_turn:.2f} ms a turn), turns' client "
            f"{cores['turn_client']:.2f}"
            + (f", readers {sum(readers.values()):.2f} ({shown})" if readers else "")
            + f"; the machine {cores['machine']:.2f} of {cores['cores']}"
        )
    check = phase["journal"]
    print(
        f"  journal verify exit {check['verify_exit']} {' '.join(check['verify_output'])}; "
        f"incomplete executions {check['incomplete_executions']}"
    )


def run(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--replay", type=int, default=20, help="Replay callers beside the turns")
    parser.add_argument("--list", type=int, default=20, help="ListSessions callers beside the turns")
    parser.add_argument("--watch", type=int, default=20, help="Watch callers (where LiveSessions is served)")
    parser.add_argument("--think", type=float, default=1.0, help="seconds each reader waits between calls")
    parser.add_argument(
        "--lockstep",
        action="store_true",
        help="start every reader at once (a burst each think) instead of at a random moment of its first",
    )
    parser.add_argument(
        "--quick", action="store_true", help="20 sessions x 5 s: a smoke run, not a measurement"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(list(argv))
    if args.quick:
        args.sessions, args.seconds, args.replay, args.list, args.watch = 20, 5.0, 2, 2, 2
    pace: dict[str, Any] = {"start_ms": resultfile.pace()}
    with tempfile.TemporaryDirectory(prefix="agentsessions-bench-load-") as tmp:
        with resultfile.PaceSampler(PACE_EVERY_S) as alone_pace:
            alone = _phase("turns only", args, False, Path(tmp))
        pace["between_ms"] = resultfile.pace()
        with resultfile.PaceSampler(PACE_EVERY_S) as mixed_pace:
            mixed = _phase("turns + readers", args, True, Path(tmp))
    pace["end_ms"] = resultfile.pace()
    alone["machine_pace"], mixed["machine_pace"] = alone_pace.summary(), mixed_pace.summary()
    fastest = min(alone_pace.samples + mixed_pace.samples, default=0.0)
    alone["steady"] = steady_turns(alone.pop("window"), alone.pop("turn_starts"), alone_pace.timed, fastest)
    mixed["steady"] = steady_turns(mixed.pop("window"), mixed.pop("turn_starts"), mixed_pace.timed, fastest)
    _print("turns only", alone)
    _print("turns + readers", mixed)
    print(resultfile.pace_line(pace))
    for name, phase in (("turns only", alone), ("turns + readers", mixed)):
        print(f"  during {name}: {resultfile.sampled_line(phase['machine_pace'])}")
    slowdown = 1 - mixed["turns_per_s"] / alone["turns_per_s"] if alone["turns_per_s"] else 1.0
    list_p99 = mixed["readers"].get("list", {}).get("p99_ms", 0.0) / 1000
    errors = _errors(alone) + _errors(mixed)
    complete = all(
        p["journal"]["verify_exit"] == 0 and p["journal"]["incomplete_executions"] == 0
        for p in (alone, mixed)
    )
    goals: dict[str, dict[str, Any]] = {
        "errors": {"measured": errors, "goal": 0, "met": errors == 0},
        "reader_slowdown": {
            "measured": slowdown,
            "goal": GOAL_READER_SLOWDOWN,
            "met": slowdown <= GOAL_READER_SLOWDOWN,
        },
        "list_p99_s": {"measured": list_p99, "goal": GOAL_LIST_P99_S, "met": list_p99 < GOAL_LIST_P99_S},
        "journal_verified_and_complete": {"met": complete},
    }
    print("\ngoals")
    print(f"  errors: {errors} (goal 0): {'met' if errors == 0 else 'MISSED'}")
    print(
        f"  turns/s with readers {mixed['turns_per_s']:.1f} vs {alone['turns_per_s']:.1f} alone: "
        f"{max(0.0, slowdown):.1%} slower (goal <= {GOAL_READER_SLOWDOWN:.0%}): "
        f"{'met' if goals['reader_slowdown']['met'] else 'MISSED'}"
    )
    print(
        f"  ListSessions p99 {list_p99 * 1000:.1f} ms for a page of {LIST_PAGE} "
        f"(goal < {GOAL_LIST_P99_S * 1000:.0f} ms): {'met' if goals['list_p99_s']['met'] else 'MISSED'}"
    )
    print(f"  journals verify, every execution complete: {'met' if complete else 'MISSED'}")
    control = pace_control(alone["machine_pace"], mixed["machine_pace"])
    if control is not None:
        print(
            f"  control: the machine's pace with readers / alone {control:.2f} (mean CPU of the fixed "
            f"work in each phase): {_pace_verdict(control)}"
        )
    steady = steady_slowdown(alone["steady"], mixed["steady"])
    if steady is not None:
        print(
            f"  control: on the {STEADY_WINDOW_S:g}-s windows where the machine kept its pace "
            f"({mixed['steady']['windows']} of {mixed['steady']['of']} with readers, "
            f"{alone['steady']['windows']} of {alone['steady']['of']} alone), turns/s with readers "
            f"{mixed['steady']['turns_per_s']:.1f} vs {alone['steady']['turns_per_s']:.1f} alone: "
            f"{max(0.0, steady):.1%} slower"
        )
    if args.quick:
        print("  (quick run: not a measurement)")
    document = {
        "benchmark": "load",
        "when_unix": int(time.time()),
        "machine": resultfile.machine(pace=pace),
        "quick": args.quick,
        "arguments": {k: v for k, v in vars(args).items() if k != "out"} | {"out": str(args.out)},
        "turns_only": alone,
        "turns_and_readers": mixed,
        "goals": goals,
        "controls": {"pace_with_readers_over_alone": control, "steady_reader_slowdown": steady},
    }
    resultfile.write(args.out, document, sort_keys=False)
    return 0 if all(goal["met"] for goal in goals.values()) else 1


PACE_ALIKE: Final = 0.10  # phases whose median paces differ by more met different machines
# The machine's pace is sampled this often while the load runs (~13 ms of CPU each: ~1.3% of a
# core, in both phases alike), and a phase's turns are counted again over the windows of this many
# seconds in which every sample kept the machine's usual pace (steady_turns).
PACE_EVERY_S: Final = 1.0
STEADY_WINDOW_S: Final = 2.0


def steady_turns(
    window: Sequence[float], starts: Sequence[float], timed: Sequence[tuple[float, float]], fastest: float
) -> dict[str, Any]:
    """A phase's turns/s over its steady windows: the ``STEADY_WINDOW_S`` slices of ``window``
    (time.monotonic()) with at least one pace sample in ``timed`` and none slower than
    ``SLOW_PACE`` times ``fastest`` (the run's fastest sample). The machine this virtual machine
    runs on has slow spells, from under a second to minutes, that slow every process alike by up
    to a third; counted over the steady windows of both phases, a slowdown is the readers', not
    the machine's."""
    began, until = window
    count = int((until - began) // STEADY_WINDOW_S)
    slow = resultfile.SLOW_PACE * fastest
    steady = 0
    turns = 0
    for i in range(count):
        start = began + i * STEADY_WINDOW_S
        end = start + STEADY_WINDOW_S
        paces = [ms for at, ms in timed if start <= at < end]
        if not paces or max(paces) > slow:
            continue
        steady += 1
        turns += bisect.bisect_left(starts, end) - bisect.bisect_left(starts, start)
    seconds = steady * STEADY_WINDOW_S
    return {"windows": steady, "of": count, "turns_per_s": turns / seconds if seconds else 0.0}


def steady_slowdown(alone: Mapping[str, Any], mixed: Mapping[str, Any]) -> float | None:
    """How much slower the turns ran with readers over both phases' steady windows (None when a
    phase had none)."""
    if not alone["turns_per_s"] or not mixed["windows"]:
        return None
    return 1 - float(mixed["turns_per_s"]) / float(alone["turns_per_s"])


def pace_control(alone: dict[str, Any], mixed: dict[str, Any]) -> float | None:
    """The readers phase's mean pace over the turns-only phase's (None without samples): near 1,
    the two phases ran on the same machine; far from it, the slowdown mixes the readers' cost with
    the machine's. The mean, not the median: the pace is two-valued here (a usual speed and slow
    spells), and a median does not move until half the samples are slow."""
    if not alone.get("samples") or not mixed.get("samples"):
        return None
    ratio: float = mixed["mean_ms"] / alone["mean_ms"]
    return ratio


def _pace_verdict(ratio: float) -> str:
    if abs(ratio - 1) <= PACE_ALIKE:
        return "the phases ran at the same pace"
    slower = "slower" if ratio > 1 else "faster"
    return (
        f"the machine ran {abs(ratio - 1):.0%} {slower} with the readers: the slowdown above is not "
        "the readers' alone; run again"
    )


def _readers_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load readers")
    parser.add_argument("--target", required=True)
    parser.add_argument("--uids", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--replay", type=int, default=0)
    parser.add_argument("--list", type=int, default=0)
    parser.add_argument("--watch", type=int, default=0)
    parser.add_argument("--think", type=float, default=1.0)
    parser.add_argument("--lockstep", action="store_true")
    args = parser.parse_args(list(argv))
    args.uid_list = json.loads(Path(args.uids).read_text())
    print(json.dumps(asyncio.run(_readers(args))))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["readers"]:
        sys.exit(_readers_main(sys.argv[2:]))
    sys.exit(run(sys.argv[1:]))
