"""Chaos: ``kill -9`` the host at random moments under load, then count what was lost.

``python -m bench.chaos [--kills 5] [--seeds 1,2,3] [--sessions 20] [--settle 60]``

For each seed, on a fresh SQLite journal: ``agentsessions serve`` (built-in echo harness and model)
on a fixed loopback port; ``--sessions`` clients each run turns back to back, every turn with its own
input text and an ``idempotency-key`` header, retrying a turn whose stream broke (the host died) with
the same key until the host answers it. ``--kills`` times, at moments drawn from the seed, the host
is killed with SIGKILL and started again on the same journal and port. Then the clients stop, the
host gets ``--settle`` seconds to finish what it recovers by itself (no Resume from anyone), stops,
and the journal is read offline:

* **lost**: a turn a client saw complete whose input is in no completed execution;
* **duplicated**: an input journaled by more than one execution (a retry that ran twice);
* **incomplete**: an execution with no END record;
* the hash chain of every session verifies (``agentsessions journal verify``).

The goal (reliability issue): 0 lost, 0 duplicated, 0 incomplete over 5 kills x 3 seeds.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc
from grpc import aio

from agentsessions.v1 import common_pb2, session_pb2, session_pb2_grpc
from bench import resultfile
from bench.turns import BIN, ROOT, free_port, verify_journal

RESULTS: Final = ROOT / "bench" / "results" / "chaos.json"
START_TIMEOUT_S: Final = 60.0
CALL_TIMEOUT_S: Final = 30.0
# Reconnect quickly to the restarted host (grpc's default backoff grows to two minutes).
CHANNEL_OPTIONS: Final = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
RETRYABLE: Final = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL}
)
K: Final = common_pb2.EventKind


class Host:
    """``agentsessions serve`` on one journal and one address; killed and restarted at will."""

    def __init__(self, journal: Path, address: str, log_dir: Path, extra: Sequence[str]) -> None:
        self.journal = journal
        self.address = address
        self.log_dir = log_dir
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None
        self.incarnation = 0

    def start(self) -> None:
        self.incarnation += 1
        log = open(self.log_dir / f"host-{self.incarnation}.log", "wb")  # noqa: SIM115 - the child owns it
        argv = [str(BIN / "agentsessions"), "serve", "--listen", self.address, "--journal", str(self.journal)]
        self.proc = subprocess.Popen(
            [*argv, *self.extra], cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        with grpc.insecure_channel(self.address) as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=START_TIMEOUT_S)
            except grpc.FutureTimeoutError:
                raise RuntimeError(f"host did not start (see {self.log_dir})") from None

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Client:
    """One session's turns: every input it sent, and those it saw complete."""

    uid: str
    sent: list[str] = field(default_factory=list)
    acknowledged: list[str] = field(default_factory=list)
    retries: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    refusals: list[str] = field(default_factory=list)  # each refusal's status and message


def _text(text: str) -> common_pb2.Message:
    return common_pb2.Message(role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text=text))])


async def _turn(stub: session_pb2_grpc.SessionsStub, client: Client, text: str, stop_at: float) -> None:
    """One turn, retried with the same idempotency key until the host answers it (or time is up)."""
    request = session_pb2.ExecRequest(session=client.uid, inputs=[_text(text)])
    metadata = (("idempotency-key", f"{client.uid}/{text}"),)
    client.sent.append(text)
    while time.monotonic() < stop_at:
        completed = False
        try:
            call = stub.Exec(request, metadata=metadata, timeout=CALL_TIMEOUT_S, wait_for_ready=True)
            async for update in call:
                if update.WhichOneof("update") == "record" and update.record.event.kind == K.EVENT_END:
                    completed = update.record.event.end.state == "COMPLETED"
        except aio.AioRpcError as exc:
            if exc.code() in RETRYABLE:
                client.retries += 1
                continue
            # Anything else is the host's answer (ABORTED for a busy session, FAILED_PRECONDITION ...).
            client.refused[exc.code().name] += 1
            client.refusals.append(f"{exc.code().name}: {exc.details()}")
            return
        if completed:
            client.acknowledged.append(text)
        return


async def _drive(host: Host, clients: list[Client], until: float, stop_at: float) -> None:
    channel = aio.insecure_channel(host.address, options=CHANNEL_OPTIONS)
    try:
        stub = session_pb2_grpc.SessionsStub(channel)

        async def loop(client: Client) -> None:
            n = 0
            while time.monotonic() < until:
                n += 1
                await _turn(stub, client, f"{client.uid[-6:]}-{n}", stop_at)

        await asyncio.gather(*(loop(c) for c in clients))
    finally:
        await channel.close()


async def _create(address: str, count: int) -> list[Client]:
    async with aio.insecure_channel(address) as channel:
        stub = session_pb2_grpc.SessionsStub(channel)
        sessions = await asyncio.gather(
            *(
                stub.CreateSession(
                    session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="echo")),
                    timeout=CALL_TIMEOUT_S,
                )
                for _ in range(count)
            )
        )
    return [Client(s.metadata.uid) for s in sessions]


async def _settled(address: str, uids: list[str], limit_s: float) -> bool:
    """Wait (bounded) until no session has a running execution: the host finished what it recovers."""
    deadline = time.monotonic() + limit_s
    async with aio.insecure_channel(address) as channel:
        stub = session_pb2_grpc.SessionsStub(channel)
        while time.monotonic() < deadline:
            states = await asyncio.gather(
                *(stub.GetSession(session_pb2.GetSessionRequest(uid=u), timeout=CALL_TIMEOUT_S) for u in uids)
            )
            if all(s.exec_state != session_pb2.EXEC_RUNNING for s in states):
                return True
            await asyncio.sleep(0.5)
    return False


async def _journal_counts(journal: Path, clients: list[Client]) -> dict[str, int]:
    from agentsessions.host.journal import open_store

    store = await open_store(str(journal))
    try:
        lost = duplicated = incomplete = executions = 0
        for client in clients:
            records = await store.read(client.uid)
            inputs: dict[str, set[str]] = defaultdict(set)  # input text -> executions journaling it
            ended: dict[str, str] = {}
            started: set[str] = set()
            for record in records:
                event = record.event
                if event.kind == K.EVENT_EXECUTION_START:
                    started.add(event.execution_id)
                elif event.kind == K.EVENT_INPUT:
                    text = "".join(p.text.text for p in event.message.parts)
                    inputs[text].add(event.execution_id)
                elif event.kind == K.EVENT_END:
                    ended[event.execution_id] = event.end.state
            executions += len(started)
            incomplete += len(started - set(ended))
            duplicated += sum(1 for ids in inputs.values() if len(ids) > 1)
            completed = {e for e, state in ended.items() if state == "COMPLETED"}
            lost += sum(1 for text in client.acknowledged if not inputs.get(text, set()) & completed)
        return {"executions": executions, "lost": lost, "duplicated": duplicated, "incomplete": incomplete}
    finally:
        await store.close()


def _seed_run(seed: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    rng = random.Random(seed)
    workdir = tmp / f"seed-{seed}"
    workdir.mkdir()
    journal = workdir / "journal.db"
    host = Host(journal, f"127.0.0.1:{free_port()}", workdir, args.host_arg)
    host.start()
    try:
        clients = asyncio.run(_create(host.address, args.sessions))
        kill_at = sorted(rng.uniform(0.5, args.kills * args.spacing) for _ in range(args.kills))
        load_s = args.kills * args.spacing + args.spacing

        async def chaos() -> None:
            began = time.monotonic()
            until = began + load_s
            driving = asyncio.create_task(_drive(host, clients, until, until + args.settle))
            for at in kill_at:
                await asyncio.sleep(max(0.0, began + at - time.monotonic()))
                await asyncio.to_thread(host.kill)
                await asyncio.to_thread(host.start)
            await driving

        asyncio.run(chaos())
        settled = asyncio.run(_settled(host.address, [c.uid for c in clients], args.settle))
    finally:
        host.stop()
    counts = asyncio.run(_journal_counts(journal, clients))
    verified = verify_journal(journal)
    refused: Counter[str] = Counter()
    for c in clients:
        refused.update(c.refused)
    return {
        "seed": seed,
        "kills": len(kill_at),
        "kill_at_s": [round(t, 3) for t in kill_at],
        "turns_sent": sum(len(c.sent) for c in clients),
        "turns_acknowledged": sum(len(c.acknowledged) for c in clients),
        "retries": sum(c.retries for c in clients),
        "refused": dict(refused),
        "refusals": sorted(set(m for c in clients for m in c.refusals))[:20],
        "settled_by_itself": settled,
        "verify_exit": verified.returncode,
        **counts,
    }


def run(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds, one run each")
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--spacing", type=float, default=2.0, help="mean seconds of load per kill")
    parser.add_argument(
        "--settle", type=float, default=60.0, help="seconds the host gets to recover by itself"
    )
    parser.add_argument(
        "--host-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra `agentsessions serve` argument",
    )
    parser.add_argument("--quick", action="store_true", help="2 kills, one seed, 5 sessions: a smoke run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(list(argv))
    if args.quick:
        args.kills, args.seeds, args.sessions = 2, "1", 5
    seeds = [int(s) for s in args.seeds.split(",") if s]
    with tempfile.TemporaryDirectory(prefix="agentsessions-bench-chaos-") as tmp:
        runs = [_seed_run(seed, args, Path(tmp)) for seed in seeds]
    print(f"\nchaos: {args.kills} kills x {len(seeds)} seeds, {args.sessions} sessions each")
    print("  seed  turns sent  acknowledged  retries  lost  duplicated  incomplete  verify  settled")
    for r in runs:
        print(
            f"  {r['seed']:4d}  {r['turns_sent']:10d}  {r['turns_acknowledged']:12d}  {r['retries']:7d}"
            f"  {r['lost']:4d}  {r['duplicated']:10d}  {r['incomplete']:10d}  {r['verify_exit']:6d}"
            f"  {'yes' if r['settled_by_itself'] else 'no'}"
        )
        if r["refused"]:
            print(f"        refused by the host: {r['refused']}")
            for message in r["refusals"]:
                print(f"          {message}")
    totals = {key: sum(r[key] for r in runs) for key in ("lost", "duplicated", "incomplete")}
    met = all(v == 0 for v in totals.values()) and all(r["verify_exit"] == 0 for r in runs)
    print(
        f"  total: {totals['lost']} lost, {totals['duplicated']} duplicated, "
        f"{totals['incomplete']} incomplete (goal 0/0/0, chains verify): {'met' if met else 'MISSED'}"
    )
    document = {
        "benchmark": "chaos",
        "when_unix": int(time.time()),
        "machine": resultfile.machine(),
        "quick": args.quick,
        "arguments": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "runs": runs,
        "totals": totals,
        "met": met,
    }
    resultfile.write(args.out, document, sort_keys=False)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
