"""``agentsessions replay``: the operator's controller replay, its report and its exit codes
(0 replays, 1 diverged or tampered, 2 could not replay), run in-process through the CLI entry."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from agentsessions.harnesses.echo import EchoHarness
from agentsessions.host import cli
from agentsessions.v1 import common_pb2, harness_pb2
from tests.durability.commands import Command
from tests.durability.harnesses import served
from tests.durability.wire import journal_at, new_session, say
from tests.support.host import running_host


async def written(
    db: Path, harness: str = "echo", address: str = "", turns: tuple[str, ...] = ("hi",)
) -> str:
    """A session on ``harness`` with one finished turn per text, in the journal at ``db`` (closed)."""
    remote = {harness: address} if address else {}
    async with journal_at(db) as store, running_host(store, remote=remote) as host:
        uid = await new_session(host, harness)
        for text in turns:
            await host.exec(say(uid, text))
    return uid


class VersionTwoEcho(EchoHarness):
    async def describe(self) -> harness_pb2.HarnessDescriptor:
        desc = await super().describe()
        desc.version = "2"
        return desc


async def test_a_session_the_host_wrote_replays(tmp_path: Path, command: Command) -> None:
    db = tmp_path / "journal.db"
    uid = await written(db, turns=("hi", "there"))
    run = await command("replay", "--journal", db, "--session", uid)
    assert run.code == 0, run.err
    assert run.out.splitlines() == [
        f"ok: session {uid} replays: 2 executions, 2 outputs; 2 model calls served from the journal, "
        "0 sent to the provider; 10 records verified, nothing written",
        '  output 1: "echo:hi"',
        '  output 2: "echo:there"',
    ]
    again = await command("replay", "--journal", f"sqlite://{db}", "--session", uid)
    assert again.code == 0 and again.out == run.out


async def test_a_tampered_chain_is_named_and_nothing_runs(tmp_path: Path, command: Command) -> None:
    db = tmp_path / "journal.db"
    uid = await written(db)
    forged = common_pb2.Event(
        kind=common_pb2.EVENT_OUTPUT,
        message=common_pb2.Message(
            role="assistant", parts=[common_pb2.Part(text=common_pb2.TextPart(text="forged"))]
        ),
    ).SerializeToString()
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        changed = conn.execute(
            "UPDATE events SET event = ? WHERE session = ? AND seq = 4", (forged, uid)
        ).rowcount
    assert changed == 1
    run = await command("replay", "--journal", db, "--session", uid)
    assert run.code == 1
    assert f"FAILED: session {uid} seq 4" in run.err and run.out == ""


async def test_what_cannot_be_replayed_exits_2(tmp_path: Path, command: Command) -> None:
    db = tmp_path / "journal.db"
    await written(db)
    unknown = await command("replay", "--journal", db, "--session", "sess-nobody")
    assert unknown.code == 2 and "no session sess-nobody" in unknown.err
    absent = tmp_path / "absent.db"
    missing = await command("replay", "--journal", absent, "--session", "sess-nobody")
    assert missing.code == 2 and "no such file" in missing.err
    assert not absent.exists(), "a replay never creates a journal"
    memory = await command("replay", "--journal", "memory:", "--session", "sess-nobody")
    assert memory.code == 2 and "memory:" in memory.err
    bad_flag = await command("replay", "--journal", db, "--session", "x", "--harness", "no-equals-sign")
    assert bad_flag.code == 2 and "NAME=ADDRESS" in bad_flag.err


async def test_a_harness_this_host_does_not_serve_exits_2(tmp_path: Path, command: Command) -> None:
    db = tmp_path / "journal.db"
    async with served(EchoHarness()) as address:
        uid = await written(db, "wire-echo", address)
    run = await command("replay", "--journal", db, "--session", uid)
    assert run.code == 2
    assert "wire-echo" in run.err and "does not serve" in run.err


async def test_a_different_harness_version_exits_2(tmp_path: Path, command: Command) -> None:
    db = tmp_path / "journal.db"
    async with served(EchoHarness()) as address:
        uid = await written(db, "wire-echo", address)
    async with served(VersionTwoEcho()) as address:
        run = await command("replay", "--journal", db, "--session", uid, "--harness", f"wire-echo={address}")
        assert run.code == 2
        assert "version '1'" in run.err and "version '2'" in run.err


def test_replay_is_an_agentsessions_subcommand() -> None:
    help_text = cli.build_parser().format_help()
    assert "replay" in help_text
