"""Turn-level benchmarks: the durable host against a bare gRPC floor, measured in one run.

Every process is real and separate (client, host, harness), talking gRPC over loopback:

* protocol floor: ``bench.turn_floor`` host and harness exchange exactly the frames of an echo turn
  (Exec stream of 6 updates; Connect stream of Start, MODEL_CALL, ModelResult, END), no journal,
  no hashing; turns/s for 1 and for 32 concurrent sessions;
* durable host: ``agentsessions serve`` (SQLite journal, synchronous=FULL as shipped, built-in echo
  model) with ``agentsessions-harness serve agentsessions.harnesses.echo:EchoHarness`` out of
  process; the same client; ratio to the floor (goal >= 0.50 at 1 session, >= 0.70 at 32). The
  same host on the memory journal is reported beside it, to tell the disk's share of a turn from
  the host's own;
* model round trip: one ``sink.model`` call in an out-of-process harness (the host journals
  MODEL_CALL, runs the echo model, journals OUTPUT, replies) against a bare bidi ping-pong of the
  same frames (goal <= 3x);
* flatness: latency of turn 1,000 against turn 10 of one session (goal <= 1.2x); with ``long``
  (``python -m bench turns --long``) also turn 10,000, in sessions of 10,005 turns;
* LangGraph: a one-node echo graph on LangGraph's SqliteSaver, 1 and 32 threads (goal: the host
  does at least 2.5x at 1 thread, 3x at 32), when the optional extra (bench/requirements.txt) is
  installed.

Every server process (the floors, the ping-pong, the harnesses, the hosts) runs on the gRPC
transport the ``agentsessions`` commands choose (``agentsessions.sdk.grpcenv``), so a ratio to the
floor measures the host's own work; the same floor on grpcio's default transport is measured too,
as a control row. The clients stay on grpcio's default, as a user's program would; the host is
driven once more by a client on the commands' transport, a control row beside the LangGraph goal
(that client spends ~20% less CPU a turn, on the same two cores as the host).

Throughputs are the best of ``repeats`` runs, LangGraph's included: floors, hosts and LangGraph
interleaved in the same rounds, LangGraph on a fresh file each run as the client's sessions are fresh
each run. Results go to bench/results/turns.json and a table on stdout. Every process is stopped when
the suite ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import grpc

from agentsessions.sdk.grpcenv import LEGACY_IO, VARIABLE
from bench import resultfile

ROOT: Final = Path(__file__).resolve().parent.parent
RESULTS: Final = ROOT / "bench" / "results" / "turns.json"
BIN: Final = Path(sys.executable).parent

CONCURRENT: Final = 32
LANGGRAPH: Final = "langgraph"  # its name in the throughput rounds' log
# The host again, its client on the transport the commands choose (a control: README, "gRPC's transport").
CLIENT_IO: Final = "host-client-io"
# Issue #13's goals by concurrent sessions: one session waits on its durable commits one after
# another, so its goals are lower than those of the 32, which are bound by CPU.
GOAL_FLOOR_RATIO: Final = {"1": 0.50, str(CONCURRENT): 0.70}
GOAL_ROUND_TRIP_RATIO: Final = 3.0
GOAL_FLATNESS: Final = 1.2
GOAL_LANGGRAPH_RATIO: Final = {"1": 2.5, str(CONCURRENT): 3.0}
# Issue #13 item 4: the echo harness (served by the SDK) within 1.3x the floor harness's CPU a turn.
GOAL_HARNESS_CPU_RATIO: Final = 1.3
START_TIMEOUT_S: Final = 60.0
# A client run may take its measuring window plus this much (startup, warmup, the last turns).
CLIENT_SLACK_S: Final = 120.0


@dataclass(frozen=True)
class Sizes:
    seconds: float  # measuring window of one throughput run
    repeats: int  # throughput runs per configuration (best kept)
    warmup: int  # untimed turns per session before each window
    round_trips: int  # model calls timed (host-mediated and ping-pong alike)
    flat_positions: tuple[int, ...]  # the early turn, then the later turns compared with it
    flat_runs: int  # flatness sessions (median kept)


FULL: Final = Sizes(
    seconds=5.0,
    repeats=2,
    warmup=3,
    round_trips=400,
    flat_positions=(10, 1_000),
    flat_runs=3,
)
# ``--long``: the same, with turn 10,000 compared too (two sessions of 10,005 turns, ~3 minutes).
LONG: Final = Sizes(
    seconds=5.0,
    repeats=2,
    warmup=3,
    round_trips=400,
    flat_positions=(10, 1_000, 10_000),
    flat_runs=2,
)
QUICK: Final = Sizes(
    seconds=1.5,
    repeats=1,
    warmup=2,
    round_trips=60,
    flat_positions=(10, 100),
    flat_runs=1,
)
# Latencies around a position: turns position-5 .. position+5.
FLAT_WINDOW: Final = 5


# -- processes -----------------------------------------------------------------------------------


def free_port() -> int:
    """A loopback TCP port free right now (for a process the suite starts)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def verify_journal(journal: Path) -> subprocess.CompletedProcess[str]:
    """``agentsessions journal verify`` on a journal file, offline (its output captured)."""
    return subprocess.run(
        [str(BIN / "agentsessions"), "journal", "verify", "--journal", str(journal)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


# grpcio's default transport for a process of the benchmark (GRPC_EXPERIMENTS set empty).
DEFAULT_TRANSPORT: Final = ""


def _env(transport: str | None = LEGACY_IO, first: Sequence[str] = ()) -> dict[str, str]:
    """A child's environment. Servers run on the gRPC transport the ``agentsessions`` commands
    choose (``agentsessions.sdk.grpcenv``), the bare floor as well as the host, so a ratio to the
    floor measures the host's own work; ``transport=None`` leaves a process on grpcio's default (the
    benchmark's clients, like a user's program). An environment that sets GRPC_EXPERIMENTS keeps
    its setting everywhere. ``first``: directories ahead of the installed packages on the child's
    path (another tree's sources: ``bench.ab``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), *first, env.get("PYTHONPATH", "")) if p)
    if transport is not None:
        env.setdefault(VARIABLE, transport)
    return env


class Fleet:
    """The benchmark's server processes; all of them are stopped when the fleet closes."""

    def __init__(self, workdir: Path, sources: Sequence[str] = ()) -> None:
        self.workdir = workdir
        # Source directories the servers import from ahead of the installed packages (bench.ab).
        self.sources = tuple(sources)
        self._procs: list[tuple[str, subprocess.Popen[str], TextIO]] = []
        self.pids: dict[str, int] = {}

    def _spawn(self, name: str, argv: Sequence[str], transport: str = LEGACY_IO) -> subprocess.Popen[str]:
        log = open(self.workdir / f"{name}.log", "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        proc = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env=_env(transport, self.sources),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        self._procs.append((name, proc, log))
        self.pids[name] = proc.pid
        return proc

    def announced(self, name: str, argv: Sequence[str], transport: str = LEGACY_IO) -> str:
        """Start a server that prints ``listening on ADDR``; returns ADDR."""
        proc = self._spawn(name, argv, transport)
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            if not sel.select(START_TIMEOUT_S):
                raise RuntimeError(f"{name} did not start within {START_TIMEOUT_S:g} s")
        line = proc.stdout.readline().strip()
        if not line.startswith("listening on "):
            raise RuntimeError(f"{name} did not start: {line!r} (see {self.workdir / name}.log)")
        return line.removeprefix("listening on ")

    def host(self, name: str, journal: str, harnesses: dict[str, str]) -> str:
        """Start ``agentsessions serve`` and wait until it accepts calls; returns its address."""
        address = f"127.0.0.1:{free_port()}"
        argv = [str(BIN / "agentsessions"), "serve", "--listen", address, "--journal", journal]
        for harness, target in harnesses.items():
            argv += ["--harness", f"{harness}={target}"]
        proc = self._spawn(name, argv)
        with grpc.insecure_channel(address) as channel:
            ready = grpc.channel_ready_future(channel)
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                try:
                    ready.result(timeout=0.5)
                    break
                except grpc.FutureTimeoutError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"{name} did not start (see {self.workdir / name}.log)") from None
        return address

    def close(self) -> None:
        for _, proc, _ in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc, log in self._procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
            log.close()
        self._procs.clear()


@contextlib.contextmanager
def fleet(workdir: Path, sources: Sequence[str] = ()) -> Iterator[Fleet]:
    f = Fleet(workdir, sources)
    try:
        yield f
    finally:
        f.close()


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU a live process has used (Linux /proc; None where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    # After the command name: state is field 3 of stat(5), utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _python(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def run_json(argv: Sequence[str], timeout: float, transport: str | None = None) -> dict[str, Any]:
    """Run a worker to completion and parse the JSON object it prints last (on grpcio's default
    transport unless ``transport`` is given: a client, as a user's program would be)."""
    done = subprocess.run(
        list(argv),
        cwd=ROOT,
        env=_env(transport),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} failed ({done.returncode}): {done.stderr[-2000:]}")
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"{' '.join(argv[:4])} printed nothing: {done.stderr[-2000:]}")
    value = json.loads(lines[-1])
    assert isinstance(value, dict)
    return value


def client_argv(target: str, harness: str, sessions: int, warmup: int, seconds: float) -> list[str]:
    """The turns client's command: ``sessions`` sessions on ``target``, ``warmup`` untimed turns
    each, then turns for ``seconds``."""
    return _python(
        "bench.turn_client",
        "turns",
        "--target",
        target,
        "--harness",
        harness,
        "--sessions",
        str(sessions),
        "--warmup",
        str(warmup),
        "--seconds",
        str(seconds),
    )


def client_turns(
    target: str,
    harness: str,
    sessions: int,
    sizes: Sizes,
    *,
    turns: int = 0,
    warmup: int | None = None,
    latencies: bool = False,
    seconds: float | None = None,
    transport: str | None = None,
) -> dict[str, Any]:
    window = sizes.seconds if seconds is None else seconds
    argv = client_argv(target, harness, sessions, sizes.warmup if warmup is None else warmup, window)
    if turns:
        argv += ["--turns", str(turns)]
    if latencies:
        argv.append("--latencies")
    return run_json(argv, window + CLIENT_SLACK_S, transport)


# -- measurements --------------------------------------------------------------------------------


@dataclass
class Report:
    sizes: Sizes
    throughput: dict[str, dict[str, float]] = field(default_factory=dict)
    # CPU ms per turn of each process, from the best run: system -> sessions -> process -> ms
    cpu_ms_per_turn: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    updates_per_turn: dict[str, float] = field(default_factory=dict)
    round_trip_s: dict[str, float] = field(default_factory=dict)
    flatness: dict[str, Any] = field(default_factory=dict)
    langgraph: dict[str, Any] = field(default_factory=dict)

    def best(self, system: str, sessions: int, value: float, cpu_ms: dict[str, float]) -> None:
        runs = self.throughput.setdefault(system, {})
        key = str(sessions)
        if value > runs.get(key, 0.0):
            runs[key] = value
            self.cpu_ms_per_turn.setdefault(system, {})[key] = cpu_ms


@dataclass(frozen=True)
class System:
    """A system under test: where the client dials, which harness it asks for, the pids of its
    host and harness processes (for CPU accounting), and the gRPC transport of its client (None:
    grpcio's default, as a user's program has unless it chooses)."""

    target: str
    harness: str
    host_pid: int
    harness_pid: int
    client_transport: str | None = None


def measure_throughput(
    report: Report, targets: dict[str, System], sizes: Sizes, log: TextIO, langgraph_dir: Path | None = None
) -> None:
    """Best-of-``repeats`` turns/s per system at 1 and 32 sessions, systems interleaved, with the
    CPU each process spent per turn (the client's over its timed window, the servers' over the
    whole client run, warmup included). The systems' order is reversed every other round: on this
    machine the system measured first in a round runs a few per cent slower (bench/NOTEBOOK.md).
    With ``langgraph_dir`` LangGraph runs in each round too, last in it or first, and its best is
    kept the same way (one run of it against the host's best of two favoured the host)."""
    for attempt in range(sizes.repeats):
        for sessions in (1, CONCURRENT):
            order: list[tuple[str, System | None]] = list(targets.items())
            if langgraph_dir is not None and "unavailable" not in report.langgraph:
                order.append((LANGGRAPH, None))
            if attempt % 2:
                order.reverse()
            for system, sut in order:
                if sut is None:
                    assert langgraph_dir is not None  # only then is LangGraph in the order
                    turns_per_s = measure_langgraph(
                        report, langgraph_dir / f"round-{attempt + 1}", sessions, sizes
                    )
                    if turns_per_s is not None:
                        _progress(log, attempt, sizes, system, sessions, turns_per_s)
                    continue
                before = (cpu_seconds(sut.host_pid), cpu_seconds(sut.harness_pid))
                result = client_turns(
                    sut.target, sut.harness, sessions, sizes, transport=sut.client_transport
                )
                after = (cpu_seconds(sut.host_pid), cpu_seconds(sut.harness_pid))
                turns = result["turns"] + sessions * sizes.warmup
                cpu_ms = {"client": result["cpu_s"] * 1e3 / max(result["turns"], 1)}
                for name, b, a in zip(("host", "harness"), before, after, strict=True):
                    if a is not None and b is not None:
                        cpu_ms[name] = (a - b) * 1e3 / turns
                report.best(system, sessions, result["turns_per_s"], cpu_ms)
                report.updates_per_turn[system] = result["updates_per_turn"]
                _progress(log, attempt, sizes, system, sessions, result["turns_per_s"])


def _progress(
    log: TextIO, attempt: int, sizes: Sizes, system: str, sessions: int, turns_per_s: float
) -> None:
    print(
        f"  [{attempt + 1}/{sizes.repeats}] {system:<12} {sessions:>2} session(s): "
        f"{turns_per_s:8.1f} turns/s",
        file=log,
        flush=True,
    )


def _median_tail(latencies: list[float]) -> float:
    """Median of the later 80% of the calls (the first fifth warms connections and caches)."""
    return statistics.median(latencies[len(latencies) // 5 :])


def measure_round_trips(
    report: Report, f: Fleet, hosts: dict[str, str], loop_harness: str, sizes: Sizes
) -> None:
    calls = sizes.round_trips
    pp_harness = f.announced("pingpong-harness", _python("bench.turn_floor", "pingpong-harness"))
    out = f.workdir / "pingpong.json"
    run_json(
        _python(
            "bench.turn_floor",
            "pingpong-host",
            "--harness",
            pp_harness,
            "--calls",
            str(calls),
            "--out",
            str(out),
        ),
        CLIENT_SLACK_S,
        LEGACY_IO,  # the bare host's side of the ping-pong, on the transport the host runs on
    )
    report.round_trip_s["pingpong"] = _median_tail(json.loads(out.read_text()))
    for system, target in hosts.items():
        out = f.workdir / f"roundtrip-{system}.json"
        plan = json.dumps({"calls": calls, "out": str(out)})
        run_json(
            _python(
                "bench.turn_client", "exec", "--target", target, "--harness", loop_harness, "--config", plan
            ),
            CLIENT_SLACK_S + calls,
        )
        report.round_trip_s[system] = _median_tail(json.loads(out.read_text()))


def measure_flatness(report: Report, target: str, harness: str, sizes: Sizes) -> None:
    """Each later turn against the early one of one session (the goal), and, as a control timed
    in the same seconds, the last one against turn ``early`` of a fresh session alternated with
    the long one's last turns (load on a shared machine drifts over the minutes a long session
    takes)."""
    early, *later = sizes.flat_positions
    last = later[-1]
    fresh = early + FLAT_WINDOW
    latencies: dict[int, list[float]] = {p: [] for p in sizes.flat_positions}
    fresh_s: list[float] = []

    def around(series: list[float], position: int) -> float:
        return statistics.median(series[position - 1 - FLAT_WINDOW : position + FLAT_WINDOW])

    for _ in range(sizes.flat_runs):
        result = run_json(
            _python(
                "bench.turn_client",
                "flat",
                "--target",
                target,
                "--harness",
                harness,
                "--turns",
                str(last + FLAT_WINDOW),
                "--fresh",
                str(fresh),
            ),
            CLIENT_SLACK_S + last,  # a bound, far above what the turns take
        )
        series, control = result["session"], result["fresh"]
        for position in sizes.flat_positions:
            latencies[position].append(around(series, position))
        fresh_s.append(around(control, early))
    report.flatness = {
        "positions": list(sizes.flat_positions),
        "latency_s": {str(p): statistics.median(v) for p, v in latencies.items()},
        "early_s": statistics.median(latencies[early]),
        "late_s": statistics.median(latencies[last]),
        "fresh_early_s": statistics.median(fresh_s),
        "runs": sizes.flat_runs,
    }


def measure_langgraph(report: Report, workdir: Path, threads: int, sizes: Sizes) -> float | None:
    """One LangGraph run of ``threads`` threads on a fresh file in ``workdir``; keeps the best in
    ``report`` and returns this run's turns/s (None when LangGraph is not installed)."""
    workdir.mkdir(parents=True, exist_ok=True)
    result = run_json(
        _python(
            "bench.langgraph_echo",
            "--db",
            str(workdir / f"langgraph-{threads}.db"),
            "--threads",
            str(threads),
            "--warmup",
            str(sizes.warmup),
            "--seconds",
            str(sizes.seconds),
        ),
        sizes.seconds + CLIENT_SLACK_S,
    )
    if "unavailable" in result:
        report.langgraph = {"unavailable": result["unavailable"]}
        return None
    turns_per_s: float = result["turns_per_s"]
    key = str(threads)
    report.langgraph[key] = max(turns_per_s, report.langgraph.get(key, 0.0))
    return turns_per_s


# -- report --------------------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def cpu_budget(report: Report, cores: int, system: str = "host") -> dict[str, Any] | None:
    """What the machine allows ``system`` at 32 sessions: every process of it (host, harness and
    the benchmark's client) shares the same ``cores``, so their CPU a turn caps its turns a second
    however they are scheduled. With the turns the LangGraph goal asks for, which a cap under it
    rules out. None when the run has no CPU figures for it."""
    n = str(CONCURRENT)
    cpu = report.cpu_ms_per_turn.get(system, {}).get(n)
    if not cpu or cores <= 0:
        return None
    parts = {p: cpu[p] for p in ("host", "harness", "client") if cpu.get(p)}
    total = sum(parts.values())
    if total <= 0:
        return None
    cap = cores * 1000.0 / total
    done = report.throughput.get(system, {}).get(n)
    langgraph = report.langgraph.get(n) if "unavailable" not in report.langgraph else None
    return {
        "sessions": CONCURRENT,
        "cores": cores,
        "cpu_ms_per_turn": parts,
        "total_ms": total,
        "cap_turns_per_s": cap,
        "turns_per_s": done,
        "share_of_cap": _ratio(done, cap),
        "langgraph_goal_turns_per_s": None if langgraph is None else GOAL_LANGGRAPH_RATIO[n] * langgraph,
    }


def summary(report: Report) -> dict[str, Any]:
    """Ratios and goal verdicts derived from the raw numbers."""
    t = report.throughput
    goals: list[dict[str, Any]] = []

    def goal(name: str, value: float | None, target: float, at_least: bool, *, control: bool = False) -> None:
        """A goal's verdict; a control (a comparison beside a goal) is measured and never judged."""
        met = None
        if value is not None and not control:
            met = value >= target if at_least else value <= target
        goals.append({"goal": name, "value": value, "target": target, "at_least": at_least, "met": met})

    for n in ("1", str(CONCURRENT)):
        goal(
            f"host/floor turns/s, {n} session(s)",
            _ratio(t.get("host", {}).get(n), t.get("floor", {}).get(n)),
            GOAL_FLOOR_RATIO[n],
            True,
        )
    for n in ("1", str(CONCURRENT)):
        goal(
            f"control: host / floor on the default transport, {n} session(s)",
            _ratio(t.get("host", {}).get(n), t.get("floor-default", {}).get(n)),
            GOAL_FLOOR_RATIO[n],
            True,
            control=True,
        )
    cpu = report.cpu_ms_per_turn
    for n in ("1", str(CONCURRENT)):
        goal(
            f"echo harness / floor harness CPU per turn, {n} session(s)",
            _ratio(
                cpu.get("host", {}).get(n, {}).get("harness"),
                cpu.get("floor", {}).get(n, {}).get("harness"),
            ),
            GOAL_HARNESS_CPU_RATIO,
            False,
        )
    rt = report.round_trip_s
    goal(
        "model round trip / bare ping-pong",
        _ratio(rt.get("host"), rt.get("pingpong")),
        GOAL_ROUND_TRIP_RATIO,
        False,
    )
    if report.flatness:
        fl = report.flatness
        early, *later = fl["positions"]
        for position in later:
            goal(
                f"turn {position} / turn {early} latency",
                _ratio(fl["latency_s"][str(position)], fl["early_s"]),
                GOAL_FLATNESS,
                False,
            )
        goal(
            f"control: turn {later[-1]} / fresh session's turn {early}, same seconds",
            _ratio(fl["late_s"], fl["fresh_early_s"]),
            GOAL_FLATNESS,
            False,
            control=True,
        )
    if "unavailable" not in report.langgraph:
        for n in ("1", str(CONCURRENT)):
            goal(
                f"host/LangGraph turns/s, {n} session(s)",
                _ratio(t.get("host", {}).get(n), report.langgraph.get(n)),
                GOAL_LANGGRAPH_RATIO[n],
                True,
            )
        for n in ("1", str(CONCURRENT)):
            goal(
                f"control: host/LangGraph, client on host's transport, {n} session(s)",
                _ratio(t.get(CLIENT_IO, {}).get(n), report.langgraph.get(n)),
                GOAL_LANGGRAPH_RATIO[n],
                True,
                control=True,
            )
    cores = len(os.sched_getaffinity(0))
    return {
        "goals": goals,
        "cpu_budget": cpu_budget(report, cores),
        "cpu_budget_client_io": cpu_budget(report, cores, CLIENT_IO),
    }


def print_report(report: Report, derived: dict[str, Any], out: TextIO) -> None:
    t = report.throughput
    print("\nTurn benchmarks (sizes: " + json.dumps(report.sizes.__dict__) + ")", file=out)
    print(f"{'turns/s':<34}{'1 session':>12}{str(CONCURRENT) + ' sessions':>14}  updates/turn", file=out)
    rows = [
        ("protocol floor (bare gRPC)", "floor"),
        ("floor, grpcio's default transport", "floor-default"),
        ("host, SQLite FULL", "host"),
        ("  its client on host's transport", CLIENT_IO),
        ("host, memory journal (diagnostic)", "host-memory"),
    ]
    for label, key in rows:
        if key in t:
            one, many = t[key].get("1"), t[key].get(str(CONCURRENT))
            print(
                f"{label:<34}{_num(one):>12}{_num(many):>14}  {report.updates_per_turn.get(key, 0):.0f}",
                file=out,
            )
    if "unavailable" in report.langgraph:
        print(f"{'LangGraph + SqliteSaver':<34}  not measured: {report.langgraph['unavailable']}", file=out)
    elif report.langgraph:
        lg = report.langgraph
        one, many = lg.get("1"), lg.get(str(CONCURRENT))
        print(f"{'LangGraph + SqliteSaver':<34}{_num(one):>12}{_num(many):>14}", file=out)
    for n in ("1", str(CONCURRENT)):
        print(f"\nCPU ms per turn, {n} session(s) (host / harness / client)", file=out)
        for label, key in rows:
            cpu = report.cpu_ms_per_turn.get(key, {}).get(n)
            if cpu:
                parts = " / ".join(_num(cpu.get(p), "{:.2f}") for p in ("host", "harness", "client"))
                print(f"  {label:<36}{parts}", file=out)
    for key, whose in (
        ("cpu_budget", "the benchmark's client"),
        ("cpu_budget_client_io", "a client on the host's transport"),
    ):
        budget = derived.get(key)
        if not budget:
            continue
        parts = " + ".join(f"{k} {v:.2f}" for k, v in budget["cpu_ms_per_turn"].items())
        line = (
            f"\nCPU budget, {budget['sessions']} sessions, {whose}: {parts} = {budget['total_ms']:.2f} ms a "
            f"turn on {budget['cores']} cores: at most {budget['cap_turns_per_s']:.0f} turns/s"
        )
        if budget["turns_per_s"]:
            line += f"; the host did {budget['turns_per_s']:.1f} ({budget['share_of_cap']:.0%} of that)"
        if budget["langgraph_goal_turns_per_s"]:
            line += f"; the LangGraph goal asks {budget['langgraph_goal_turns_per_s']:.0f}"
        print(line, file=out)
    rt = report.round_trip_s
    print("\nmodel round trip (median)", file=out)
    for key, label in (
        ("pingpong", "bare bidi ping-pong"),
        ("host", "host-mediated, SQLite FULL"),
        ("host-memory", "host-mediated, memory journal"),
    ):
        if key in rt:
            print(f"  {label:<32}{rt[key] * 1e6:10.0f} us", file=out)
    if report.flatness:
        fl = report.flatness
        early, *later = fl["positions"]
        turns = ", ".join(f"turn {p} {fl['latency_s'][str(p)] * 1e3:.2f} ms" for p in fl["positions"])
        print(
            f"\nflatness: {turns} (median of {fl['runs']} session(s)); control, turn {early} of a fresh "
            f"session timed beside turn {later[-1]}: {fl['fresh_early_s'] * 1e3:.2f} ms",
            file=out,
        )
    print("\ngoals", file=out)
    for g in derived["goals"]:
        verdict = {True: "met", False: "MISSED", None: "n/a"}[g["met"]]
        sign = ">=" if g["at_least"] else "<="
        value = "-" if g["value"] is None else f"{g['value']:.2f}"
        print(f"  {g['goal']:<58}{value:>8}  (goal {sign} {g['target']:g})  {verdict}", file=out)


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


# -- entry point ---------------------------------------------------------------------------------


def _measure(report: Report, workdir: Path, sizes: Sizes, log: TextIO) -> None:
    with fleet(workdir) as f:
        floor_harness = f.announced("floor-harness", _python("bench.turn_floor", "floor-harness"))
        floor = f.announced(
            "floor-host", _python("bench.turn_floor", "floor-host", "--harness", floor_harness)
        )
        # The same floor on grpcio's default transport: how much of a turn the transport's choice
        # is worth (a diagnostic row; the goals compare with the floor on the host's transport).
        floor_default_harness = f.announced(
            "floor-default-harness", _python("bench.turn_floor", "floor-harness"), DEFAULT_TRANSPORT
        )
        floor_default = f.announced(
            "floor-default-host",
            _python("bench.turn_floor", "floor-host", "--harness", floor_default_harness),
            DEFAULT_TRANSPORT,
        )
        echo = f.announced(
            "echo-harness",
            [
                str(BIN / "agentsessions-harness"),
                "serve",
                "agentsessions.harnesses.echo:EchoHarness",
                "--listen",
                "127.0.0.1:0",
            ],
        )
        loop = f.announced("loop-harness", _python("bench.turn_harness"))
        harnesses = {"bench-echo": echo, "bench-loop": loop}
        host = f.host("host", str(workdir / "journal.db"), harnesses)
        host_memory = f.host("host-memory", "memory:", harnesses)
        print("throughput", file=log, flush=True)
        pids = f.pids
        measure_throughput(
            report,
            {
                "floor": System(floor, "", pids["floor-host"], pids["floor-harness"]),
                "floor-default": System(
                    floor_default, "", pids["floor-default-host"], pids["floor-default-harness"]
                ),
                "host": System(host, "bench-echo", pids["host"], pids["echo-harness"]),
                # The same host and harness, driven by a client on the transport the commands choose.
                CLIENT_IO: System(host, "bench-echo", pids["host"], pids["echo-harness"], LEGACY_IO),
                "host-memory": System(host_memory, "bench-echo", pids["host-memory"], pids["echo-harness"]),
            },
            sizes,
            log,
            workdir / "langgraph",
        )
        print("model round trip", file=log, flush=True)
        measure_round_trips(report, f, {"host": host, "host-memory": host_memory}, "bench-loop", sizes)
        print("flatness", file=log, flush=True)
        measure_flatness(report, host, "bench-echo", sizes)


def run(*, quick: bool, long: bool = False, out: Path = RESULTS) -> int:
    sizes = QUICK if quick else LONG if long else FULL
    report = Report(sizes)
    workdir = Path(tempfile.mkdtemp(prefix="agentsessions-bench-turns-"))
    pace: dict[str, Any] = {"start_ms": resultfile.pace()}
    try:
        with resultfile.PaceSampler() as sampler:
            _measure(report, workdir, sizes, sys.stdout)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    pace |= {"end_ms": resultfile.pace(), "during": sampler.summary()}
    derived = summary(report)
    print_report(report, derived, sys.stdout)
    print(resultfile.pace_line(pace))
    document = {
        "suite": "turns",
        "quick": quick,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": resultfile.machine(pace=pace),
        "sizes": report.sizes.__dict__,
        "turns_per_s": report.throughput,
        "cpu_ms_per_turn": report.cpu_ms_per_turn,
        "updates_per_turn": report.updates_per_turn,
        "model_round_trip_s": report.round_trip_s,
        "flatness": report.flatness,
        "langgraph_turns_per_s": report.langgraph,
        **derived,
    }
    resultfile.write(out, document)
    print(f"\nwrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(run(quick="--quick" in sys.argv[1:], long="--long" in sys.argv[1:]))
