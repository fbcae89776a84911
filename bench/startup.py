"""Start-up benchmark: ``agentsessions serve`` against a bare ``grpc.aio`` server, in one run.

Both are started as fresh processes the same way (the same interpreter, every module compiled
beforehand by one untimed start of each, as an installed package has them) and timed from the spawn
until a ``grpc.health.v1.Health/Check`` on their port answers SERVING. The bare server (``python -m
bench.startup bare``) imports grpc and the health service, binds a port and serves health, nothing
else: what any grpc.aio server pays. The host is served as shipped (SQLite journal in a fresh
directory, the built-in harnesses, access log at info). Runs alternate between the two; the median
of each counts. Goal (issue #13): the host within 2x the bare server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import resultfile
from bench.turns import free_port

ROOT: Final = Path(__file__).resolve().parent.parent
RESULTS: Final = ROOT / "bench" / "results" / "startup.json"
GOAL_RATIO: Final = 2.0
START_TIMEOUT_S: Final = 60.0
POLL_S: Final = 0.002


def _env(pycache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    # Compiled modules, as an installed package has them (pip compiles at install): one untimed start
    # of each server writes them here, outside the repository; the timed starts read them.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def time_to_serving(argv: Sequence[str], address: str, workdir: Path) -> float:
    """Seconds from spawning ``argv`` until ``address`` answers a health check SERVING."""
    with open(workdir / "server.log", "w", encoding="utf-8") as log:
        began = time.perf_counter()
        proc = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env=_env(workdir / "pycache"),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        try:
            while not _serving(address):
                if proc.poll() is not None:
                    raise RuntimeError(f"{argv[1]} exited before serving (see {workdir / 'server.log'})")
                if time.perf_counter() - began > START_TIMEOUT_S:
                    raise RuntimeError(f"{argv[1]} did not serve within {START_TIMEOUT_S:g} s")
                time.sleep(POLL_S)
            return time.perf_counter() - began
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _host_argv(address: str, workdir: Path) -> list[str]:
    journal = workdir / "journal.db"
    journal.unlink(missing_ok=True)
    return [
        str(Path(sys.executable).parent / "agentsessions"),
        "serve",
        "--listen",
        address,
        "--journal",
        str(journal),
    ]


def _bare_argv(address: str) -> list[str]:
    return [sys.executable, "-m", "bench.startup", "bare", "--listen", address]


def measure(rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"bare": [], "host": []}
    with tempfile.TemporaryDirectory(prefix="agentsessions-bench-startup-") as tmp:
        workdir = Path(tmp)
        for argv in (_bare_argv, lambda a: _host_argv(a, workdir)):
            address = f"127.0.0.1:{free_port()}"
            time_to_serving(argv(address), address, workdir)  # untimed: compiles every module once
        for _ in range(rounds):
            address = f"127.0.0.1:{free_port()}"
            times["bare"].append(time_to_serving(_bare_argv(address), address, workdir))
            address = f"127.0.0.1:{free_port()}"
            times["host"].append(time_to_serving(_host_argv(address, workdir), address, workdir))
    return times


async def _serve_bare(listen: str) -> None:
    from grpc_health.v1 import health

    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_insecure_port(listen)
    await server.start()
    await server.wait_for_termination()


def run(*, quick: bool, out: Path = RESULTS) -> int:
    rounds = 3 if quick else 9
    times = measure(rounds)
    bare, host = statistics.median(times["bare"]), statistics.median(times["host"])
    ratio = host / bare
    print(f"\nstart-up to the first SERVING health check, median of {rounds} (runs alternated)")
    print(f"  bare grpc.aio server          {bare * 1e3:8.1f} ms")
    print(f"  agentsessions serve           {host * 1e3:8.1f} ms   {ratio:.2f}x bare")
    verdict = "met" if ratio <= GOAL_RATIO else "MISSED"
    print(f"  goal <= {GOAL_RATIO:g}x bare: {verdict}")
    document = {
        "suite": "startup",
        "quick": quick,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": resultfile.machine(),
        "rounds": rounds,
        "startup_s": times,
        "median_s": {"bare": bare, "host": host},
        "goals": [
            {
                "goal": "host start-up / bare grpc.aio server",
                "value": ratio,
                "target": GOAL_RATIO,
                "met": ratio <= GOAL_RATIO,
            }
        ],
    }
    resultfile.write(out, document)
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.startup")
    sub = parser.add_subparsers(dest="mode")
    bare = sub.add_parser("bare", help="serve only grpc health (the baseline process)")
    bare.add_argument("--listen", required=True)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.mode == "bare":
        asyncio.run(_serve_bare(args.listen))
        return 0
    return run(quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
