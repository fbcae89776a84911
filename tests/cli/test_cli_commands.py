"""Each client command against a real host on loopback: what it prints for a person and with
``--json``, and its exit code (documented in ``agentsessions.host.usercli.errors``)."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentsessions.client import SessionsClient
from agentsessions.host.config import HostConfig
from agentsessions.host.usercli.commands import ChainCheck
from tests.cli.conftest import cli
from tests.support.host_process import BIN, repo_env
from tests.support.serving import serving

pytestmark = pytest.mark.e2e


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[str]:
    config = HostConfig(listen="127.0.0.1:0", journal=str(tmp_path / "journal.db"), log_level="warning")
    async with serving(config) as addresses:
        yield addresses[0]


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


async def test_exec_without_a_session_creates_one_and_says_so(host: str) -> None:
    done = await cli("exec", "hi", "there", server=host)
    assert done.code == 0, done
    assert done.out == "> hi there\necho:hi there\n"
    (note,) = done.err.splitlines()
    assert note.startswith("session sess-") and note.endswith(" (created)")


async def test_exec_json_streams_deltas_before_the_output_record(host: str) -> None:
    # Past 2 KiB: the host batches streamed text into frames of up to 1 KiB (controller.deltas).
    text = " ".join(["a longer input so the echo model streams it in several frames"] * 40)
    done = await cli("exec", "--json", text, server=host)
    assert done.code == 0 and done.err == "", done
    frames = lines(done.out)
    assert list(frames[0]) == ["session"]
    order = [next(iter(f)) if "record" not in f else f["record"]["event"]["kind"] for f in frames[1:]]
    model_call, output = order.index("EVENT_MODEL_CALL"), order.index("EVENT_OUTPUT")
    deltas = [f["delta"] for f in frames[1:] if "delta" in f]
    assert len(deltas) > 2 and all(model_call < i < output for i, k in enumerate(order) if k == "delta")
    assert "".join(d.get("chunk", "") for d in deltas) == "echo:" + text
    assert order[-1] == "EVENT_END"


async def test_a_streamed_reply_is_printed_once(host: str) -> None:
    text = "a longer input so the echo model streams it in several chunks"
    done = await cli("exec", text, server=host)
    assert done.out.count("echo:" + text) == 1, done


async def test_stdin_input_and_the_session_lifecycle(host: str) -> None:
    uid = (await cli("create", "--name", "life", "--label", "team=docs", server=host)).out.strip()
    ran = await cli("exec", "-s", uid, "-", server=host, stdin="from stdin")
    assert ran.out == "> from stdin\necho:from stdin\n", ran
    shown = (await cli("get", uid, server=host)).out.splitlines()
    assert f"uid          {uid}" in shown and "labels       team=docs" in shown
    assert "state        COMPLETED (compute LIVE)" in shown and "last seq     5" in shown
    assert (await cli("suspend", uid, server=host)).out == f"{uid} exec=COMPLETED compute=COLD last_seq=6\n"
    assert (await cli("resume", uid, server=host)).out == f"{uid} exec=COMPLETED compute=LIVE last_seq=7\n"
    cancelled = await cli("cancel", uid, "--json", server=host)
    assert cancelled.code == 0, cancelled  # nothing runs: Cancel answers the session as it is
    assert json.loads(cancelled.out)["metadata"]["uid"] == uid
    deleted = await cli("delete", uid, server=host)
    assert deleted.out == f"deleted {uid}\n", deleted
    gone = await cli("get", uid, server=host)
    assert gone.code == 3 and gone.err.startswith("agentsessions get: NOT_FOUND: "), gone


async def test_list_pages_through_sessions_newest_first(host: str) -> None:
    uids = [(await cli("create", "--name", f"s{i}", server=host)).out.strip() for i in range(3)]
    table = (await cli("list", "--page-size", "1", server=host)).out.splitlines()
    assert table[0].split() == ["UID", "STATE", "COMPUTE", "SEQ", "HARNESS", "NAME"]
    assert [row.split()[0] for row in table[1:]] == uids[::-1]
    assert table[1].split() == [uids[2], "PENDING", "NONE", "0", "echo", "s2"]
    listed = lines((await cli("list", "--json", "--limit", "2", server=host)).out)
    assert [s["metadata"]["uid"] for s in listed] == uids[:0:-1]


async def test_log_prints_every_record_and_a_range(host: str) -> None:
    uid = (await cli("create", server=host)).out.strip()
    await cli("exec", "-s", uid, "one", server=host)
    await cli("exec", "-s", uid, "two", server=host)
    every = (await cli("log", uid, server=host)).out.splitlines()
    assert [line.split()[:2] for line in every[:5]] == [
        ["#1", "EXECUTION_START"],
        ["#2", "INPUT"],
        ["#3", "MODEL_CALL"],
        ["#4", "OUTPUT"],
        ["#5", "END"],
    ]
    assert len(every) == 10 and '"echo:two"' in every[8]
    window = lines((await cli("log", uid, "--from", "6", "--to", "7", "--json", server=host)).out)
    assert [int(r["seq"]) for r in window] == [6, 7]
    turns = (await cli("log", uid, "--turns", server=host)).out
    assert turns == "> one\necho:one\n> two\necho:two\n"


async def test_verify_recomputes_the_chain_and_reports_json(host: str) -> None:
    uid = (await cli("exec", "--json", "hi", server=host)).out.splitlines()[0]
    uid = json.loads(uid)["session"]["metadata"]["uid"]
    done = await cli("verify", uid, "--json", server=host)
    assert done.code == 0, done
    (report,) = lines(done.out)
    assert report["session"] == uid and report["verified"] is True and report["records"] == 5
    assert len(report["headHash"]) == 64


async def test_chain_check_finds_the_first_bad_record(host: str) -> None:
    async with SessionsClient.connect(host) as client:
        uid = (await client.create_session()).metadata.uid
        async for _ in client.exec(uid, "hi"):
            pass
        records = [r async for r in client.replay(uid)]
    good = ChainCheck(uid)
    assert all(good.take(r) for r in records) and good.count == 5
    records[2].event.model.model = "forged"
    bad = ChainCheck(uid)
    assert [bad.take(r) for r in records[:3]] == [True, True, False]
    assert (bad.failed_seq, bad.why) == (3, "content_hash does not match the recomputed hash")
    gap = ChainCheck(uid)
    assert gap.take(records[0]) and not gap.take(records[2])
    assert (gap.failed_seq, gap.why) == (2, "seq 2 is missing (found seq 3)")


async def test_verify_over_the_wire_sees_a_rewritten_record(tmp_path: Path) -> None:
    journal = tmp_path / "journal.db"
    config = HostConfig(listen="127.0.0.1:0", journal=str(journal), log_level="warning")
    async with serving(config) as addresses:
        uid = json.loads((await cli("exec", "--json", "hi", server=addresses[0])).out.splitlines()[0])
    uid = uid["session"]["metadata"]["uid"]
    with sqlite3.connect(journal) as db:
        db.execute("UPDATE events SET hash = ? WHERE session = ? AND seq = 4", ("0" * 64, uid))
    async with serving(config) as addresses:
        done = await cli("verify", uid, server=addresses[0])
    # The host serves stored records verbatim; the command recomputes and finds the rewrite.
    assert done.code == 1, done
    assert done.out == f"FAILED: session {uid} seq 4: content_hash does not match the recomputed hash\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["exec"], "exec needs TEXT"),
        (["create", "--label", "nokey"], "--label 'nokey' must be KEY=VALUE"),
        (["exec", "hi", "--deadline", "-1"], "--deadline -1 must be a positive number of seconds"),
        (["get", "x", "--timeout", "0"], "--timeout 0 must be a positive number of seconds"),
        (["get", "x", "--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
        (["approve", "x", "--execution", "e"], "name the gate with all of --execution"),
    ],
)
async def test_usage_errors_exit_2_before_anything_is_sent(host: str, args: list[str], message: str) -> None:
    done = await cli(*args, server=host)
    assert done.code == 2 and message in done.err, done


async def test_a_stale_expected_last_seq_is_refused(host: str) -> None:
    uid = (await cli("create", server=host)).out.strip()
    done = await cli("exec", "-s", uid, "--expected-last-seq", "3", "hi", "--json", server=host)
    assert done.code == 3, done
    assert json.loads(done.err.splitlines()[-1])["error"]["code"] == "ABORTED"


async def test_no_host_is_exit_4(host: str) -> None:
    done = await cli("list", "--timeout", "5", server="127.0.0.1:1")
    assert done.code == 4 and "UNAVAILABLE" in done.err, done


async def test_health_answers_0_serving_and_1_otherwise(host: str) -> None:
    assert (await cli("health", server=host)).out == f"{host}: SERVING\n"
    sessions = await cli("health", "--service", "agentsessions.v1.Sessions", server=host)
    assert sessions.code == 0, sessions
    unknown = await cli("health", "--service", "no.such.Service", server=host)
    assert unknown.code == 1 and "NOT_FOUND" in unknown.out, unknown
    nobody = await cli("health", "--quiet", server="127.0.0.1:1")
    assert (nobody.code, nobody.out) == (1, "")


async def test_watch_prints_the_stored_turns_and_stops_without_follow(host: str) -> None:
    uid = (await cli("create", server=host)).out.strip()
    await cli("exec", "-s", uid, "hi", server=host)
    await cli("exec", "-s", uid, "bye", server=host)
    done = await cli("watch", uid, "--no-follow", server=host)
    assert done.code == 0, done
    assert done.out == "> hi\necho:hi\n> bye\necho:bye\n"
    assert done.err.startswith(f"watching {uid} exec=COMPLETED")
    after = await cli("watch", uid, "--no-follow", "--after", "5", "--json", server=host)
    frames = lines(after.out)
    assert list(frames[0]) == ["session"]
    assert [int(f["record"]["seq"]) for f in frames[1:]] == list(range(6, 11))


async def test_watch_follows_a_session_as_another_client_runs_it(host: str) -> None:
    uid = (await cli("create", server=host)).out.strip()
    environ = {k: v for k, v in repo_env().items() if not k.startswith("AGENTSESSIONS_")}
    environ["AGENTSESSIONS_SERVER"] = host
    watcher = await asyncio.create_subprocess_exec(
        str(BIN / "agentsessions"),
        "watch",
        uid,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=environ,
    )
    try:
        assert watcher.stderr is not None and watcher.stdout is not None
        async with asyncio.timeout(60):
            assert (await watcher.stderr.readline()).decode().startswith(f"watching {uid}")
            await cli("exec", "-s", uid, "live one", server=host)
            printed: list[str] = []
            while not printed or printed[-1] != "   [completed]\n":
                printed.append((await watcher.stdout.readline()).decode())
        # The records in order, the state after the records that made it. Whether the follower
        # saw the turn running depends on how far behind the turn it was (tests/live pins that).
        assert [p for p in printed if p != "   [running]\n"] == [
            "> live one\n",
            "echo:live one\n",
            "   [completed]\n",
        ]
        assert printed.count("   [running]\n") <= 1
    finally:
        watcher.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            code = await watcher.wait()
    assert code == 130
