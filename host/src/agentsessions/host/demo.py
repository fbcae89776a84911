"""``make demo``: a scripted walkthrough of a durable session with the Python client.

It starts an embedded host (SQLite journal in a temporary directory, built-in echo model and
harnesses) on a loopback port — or talks to ``--server HOST:PORT`` — then creates a session,
runs two turns, replays the journal, verifies the hash chain record by record, forks the
session and continues the child, printing each step. Then, on an embedded host of its own, the
coding agent asks before it writes a file (``agentsessions.host.coding_demo``; ``--coding`` runs
only that part).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from agentsessions.client import SessionsClient
from agentsessions.host.coding_demo import coding_walkthrough
from agentsessions.host.config import HostConfig
from agentsessions.host.journal import canon
from agentsessions.host.server import serve
from agentsessions.sdk.harness import message_text
from agentsessions.v1 import common_pb2, session_pb2

K = common_pb2.EventKind


def describe(record: common_pb2.LogRecord) -> str:
    ev = record.event
    kind = K.Name(ev.kind).removeprefix("EVENT_")
    detail = ""
    body = ev.WhichOneof("body")
    if body == "message":
        detail = repr(message_text(ev.message))
    elif body == "execution_start":
        detail = f"harness={ev.execution_start.harness} inputs={ev.execution_start.input_count}"
    elif body == "model":
        detail = f"model={ev.model.model} input_hash={ev.model.input_hash[:12]}…"
    elif body == "end":
        detail = ev.end.state
    elif body == "lifecycle":
        detail = f"{common_pb2.Lifecycle.Kind.Name(ev.lifecycle.kind)} {ev.lifecycle.detail}".strip()
    return f"  #{record.seq:<3} {kind:<16} {detail:<44} {record.content_hash[:16]}…"


async def turn(client: SessionsClient, uid: str, text: str) -> None:
    print(f"\n> exec {text!r}")
    async for update in client.exec(uid, text):
        which = update.WhichOneof("update")
        if which == "record":
            print(describe(update.record))
        elif which == "session":
            print(f"  session {update.session.metadata.uid} at seq {update.session.last_seq}")


async def walkthrough(client: SessionsClient) -> int:
    session = await client.create_session(harness="echo", name="demo", labels={"from": "make-demo"})
    uid = session.metadata.uid
    print(f"created {uid} (harness {session.harness}, {session_pb2.ExecState.Name(session.exec_state)})")
    await turn(client, uid, "hi")
    await turn(client, uid, "durable agents")

    print("\n> replay (stored records, verbatim)")
    records = [r async for r in client.replay(uid)]
    prev = ""
    for r in records:
        recomputed = canon.content_hash(r.event, prev, r.seq)
        ok = r.prev_hash == prev and recomputed == r.content_hash
        print(f"{describe(r)} {'verified' if ok else 'MISMATCH'}")
        if not ok:
            print("chain verification failed", file=sys.stderr)
            return 1
        prev = r.content_hash
    print(f"  chain of {len(records)} records verifies from genesis")

    print("\n> fork at seq 5 (after the first turn) and continue the child")
    (child,) = await client.fork(uid, at_seq=5, child_names=["demo-child"])
    await turn(client, child.metadata.uid, "a different second turn")
    child_records = [r async for r in client.replay(child.metadata.uid)]
    shared = sum(1 for a, b in zip(records, child_records, strict=False) if a.content_hash == b.content_hash)
    print(f"  child shares the parent's first {shared} records (identical hashes), then diverges")

    final = await client.get_session(uid)
    print(f"\n{uid}: last_seq {final.last_seq}, {session_pb2.ExecState.Name(final.exec_state)}")
    return 0


async def run(server: str | None) -> int:
    if server:
        async with SessionsClient.connect(server) as client:
            return await walkthrough(client)
    with tempfile.TemporaryDirectory(prefix="agentsessions-demo-") as tmp:
        stop = asyncio.Event()
        bound: list[str] = []
        ready = asyncio.Event()

        def serving(addresses: Sequence[str]) -> None:
            bound.extend(addresses)
            ready.set()

        config = HostConfig(listen="127.0.0.1:0", journal=str(Path(tmp) / "demo.db"), log_level="warning")
        host = asyncio.create_task(serve(config, stop=stop, on_serving=serving))
        async with asyncio.timeout(30):
            await ready.wait()
        print(f"embedded host on {bound[0]} (journal {config.journal})")
        try:
            async with SessionsClient.connect(bound[0]) as client:
                return await walkthrough(client)
        finally:
            stop.set()
            await host


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentsessions.host.demo", description=__doc__)
    parser.add_argument("--server", help="use a running host instead of an embedded one")
    parser.add_argument("--coding", action="store_true", help="run only the coding-agent part")
    args = parser.parse_args(argv)
    return asyncio.run(both_parts(args.server, args.coding))


async def both_parts(server: str | None, coding_only: bool) -> int:
    """The sessions walkthrough, then (embedded only: it needs a scripted model) the coding agent."""
    code = 0 if coding_only else await run(server)
    if code == 0 and not server:
        code = await coding_walkthrough()
    return code


if __name__ == "__main__":
    sys.exit(main())
