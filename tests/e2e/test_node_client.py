"""The Node.js client (clients/node) against a real ``agentsessions serve`` process.

``node clients/node/demo.js ADDR`` creates an echo session, runs one turn, replays the journal and
prints a JSON summary; the host's journal must then verify offline. Without node or the installed
client (``make node-client``) the test is skipped, except when ``CI`` is set: there it fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from agentsessions.v1 import common_pb2, session_pb2
from tests.support.host import text_input
from tests.support.host_process import BIN, ROOT, HostProcess

pytestmark = pytest.mark.e2e

NODE_DIR = ROOT / "clients" / "node"
DEMO = NODE_DIR / "demo.js"
RUN_LIMIT_S = 90.0


def _node_or_skip() -> str:
    """The node executable; skips (fails when CI is set) if the Node client cannot run here."""
    node = shutil.which("node")
    if node is None:
        reason = "node is not on PATH"
    elif not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        reason = "clients/node/node_modules is missing (run `make node-client`)"
    else:
        return node
    if os.environ.get("CI"):
        pytest.fail(f"the Node client is required when CI is set: {reason}", pytrace=False)
    pytest.skip(f"Node client unavailable: {reason}")


async def _run(*argv: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        async with asyncio.timeout(RUN_LIMIT_S):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(f"{argv} did not finish within {RUN_LIMIT_S} s") from None
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_node_demo_runs_a_turn_and_the_journal_verifies(tmp_path: Path) -> None:
    node = _node_or_skip()
    journal = tmp_path / "journal.db"
    host = HostProcess(journal, tmp_path)
    await host.start()
    try:
        code, out, err = await _run(node, str(DEMO), host.address)
        assert code == 0, f"demo exited {code}\nstdout:\n{out}\nstderr:\n{err}"
        lines = out.strip().splitlines()
        summary = json.loads(lines[-1])
        assert summary["records"] == 5
        assert summary["output"] == "echo:hi"
        uid = summary["session"]
        assert isinstance(uid, str) and uid
        assert 'record 4 EVENT_OUTPUT "echo:hi"' in lines
        assert "record 5 EVENT_END" in lines

        # The session the Node client reported is the one the host holds.
        session = await host.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid), timeout=30)
        assert session.last_seq == 5
        assert session.harness == "echo"
    finally:
        stopped = await host.stop()
    assert stopped == 0, "".join(host.log_lines)

    code, out, err = await _run(str(BIN / "agentsessions"), "journal", "verify", "--journal", str(journal))
    assert code == 0, f"journal verify exited {code}\n{out}{err}"

    # With the host gone the client reports the failure through its exit status.
    code, out, err = await _run(node, str(DEMO), host.address)
    assert code != 0
    assert "demo failed:" in err


WATCH = NODE_DIR / "watch.js"


async def test_node_watch_follows_a_session_from_an_offset(tmp_path: Path) -> None:
    """``node clients/node/watch.js``: the stored records after an offset, then each new record of
    a turn another client runs, each once and in order, hashes as stored."""
    node = _node_or_skip()
    host = HostProcess(tmp_path / "journal.db", tmp_path)
    await host.start()
    try:
        created = await host.sessions.CreateSession(
            session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="echo")), timeout=30
        )
        uid = created.metadata.uid
        turn = session_pb2.ExecRequest(session=uid, inputs=[text_input("one")])
        _ = [u async for u in host.sessions.Exec(turn, timeout=30)]

        stored = await _run(node, str(WATCH), host.address, uid, "--after", "2", "--no-follow")
        assert stored[0] == 0, stored
        assert [json.loads(line)["seq"] for line in stored[1].splitlines()] == [3, 4, 5]

        following = asyncio.create_task(
            _run(node, str(WATCH), host.address, uid, "--after", "5", "--until", "10")
        )
        _ = [
            u
            async for u in host.sessions.Exec(
                session_pb2.ExecRequest(session=uid, inputs=[text_input("two")])
            )
        ]
        code, out, err = await following
        assert code == 0, err
        seen = [json.loads(line) for line in out.splitlines()]
        journal = [r async for r in host.sessions.Replay(session_pb2.ReplayRequest(session=uid))]
        assert [(s["seq"], s["kind"], s["hash"]) for s in seen] == [
            (r.seq, common_pb2.EventKind.Name(r.event.kind), r.content_hash) for r in journal[5:]
        ]
    finally:
        await host.close()
