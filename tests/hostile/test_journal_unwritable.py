"""A journal that cannot be written is visible and recovers by itself (issue #15 item 4).

Each test makes a real journal refuse writes under a running host: a SQLite file (and its WAL)
made immutable with ``chattr +i`` (where the machine allows it), and a PostgreSQL database whose
role loses its write privileges. Callers get UNAVAILABLE "journal not writable: ...", the
Sessions service reports NOT_SERVING, reads keep working, and once the storage takes writes again
the host's probe turns it SERVING without anyone's help; nothing acknowledged is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentsessions.host.journal import open_store
from agentsessions.v1 import common_pb2, session_pb2
from tests.approvals.raw_peer import Conversation, raw_peer
from tests.support.host import text_input
from tests.support.host_process import HostProcess

pytestmark = pytest.mark.e2e

SESSIONS = "agentsessions.v1.Sessions"
WAIT_S = 60.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _chattr_works(folder: Path) -> bool:
    if shutil.which("chattr") is None:
        return False
    probe = folder / "chattr-probe"
    probe.write_text("x")
    try:
        if subprocess.run(["chattr", "+i", str(probe)], capture_output=True, check=False).returncode != 0:
            return False
        try:
            with probe.open("a") as f:
                f.write("y")
            return False  # immutable in name only (privileged writer)
        except OSError:
            return True
    finally:
        subprocess.run(["chattr", "-i", str(probe)], capture_output=True, check=False)
        probe.unlink()


def _release(folder: Path) -> None:
    """Make every journal file writable again (so the test's folder can be removed)."""
    subprocess.run(
        ["chattr", "-i", *(str(p) for p in folder.glob("journal.db*"))], capture_output=True, check=False
    )


@contextlib.contextmanager
def immutable(paths: list[Path]) -> Iterator[None]:
    present = [str(p) for p in paths if p.exists()]
    subprocess.run(["chattr", "+i", *present], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", *present], check=True)


class HealthWatch:
    """The Sessions service's health as the host streams it (grpc.health.v1 Watch)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._call = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=SESSIONS)
        )

    async def until(self, status: int) -> None:
        async with asyncio.timeout(WAIT_S):
            async for update in self._call:
                if update.status == status:
                    return
        raise AssertionError("the health stream ended")

    def cancel(self) -> None:
        self._call.cancel()


async def _turn(
    host: HostProcess, uid: str = ""
) -> tuple[list[session_pb2.ExecUpdate], grpc.StatusCode, str]:
    frames: list[session_pb2.ExecUpdate] = []
    try:
        async for update in host.sessions.Exec(
            session_pb2.ExecRequest(session=uid, inputs=[text_input("hello")]), timeout=WAIT_S
        ):
            frames.append(update)
    except grpc.aio.AioRpcError as exc:
        return frames, exc.code(), exc.details() or ""
    return frames, grpc.StatusCode.OK, ""


async def _unwritable_then_writable(
    host: HostProcess, refuse: contextlib.AbstractAsyncContextManager[None]
) -> None:
    frames, code, _ = await _turn(host)
    assert code == grpc.StatusCode.OK
    uid = frames[0].session.metadata.uid
    acknowledged = [f.record for f in frames if f.WhichOneof("update") == "record"]
    async with grpc.aio.insecure_channel(host.address) as channel:
        health = HealthWatch(channel)
        try:
            await health.until(SERVING)
            async with refuse:
                # The first write that finds the journal unwritable says so to its caller.
                frames, code, details = await _turn(host, uid)
                assert code == grpc.StatusCode.UNAVAILABLE, details
                assert details.startswith("journal not writable: "), details
                await health.until(NOT_SERVING)
                # Then a turn is refused before its first frame, and so is a new session.
                frames, code, details = await _turn(host, uid)
                assert (code, frames) == (grpc.StatusCode.UNAVAILABLE, [])
                assert details.startswith("journal not writable: ")
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await host.sessions.CreateSession(session_pb2.CreateSessionRequest(), timeout=WAIT_S)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
                # Reads keep working.
                got = await host.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid), timeout=WAIT_S)
                assert got.last_seq >= len(acknowledged)
                listed = await host.sessions.ListSessions(session_pb2.ListSessionsRequest(), timeout=WAIT_S)
                assert uid in [s.metadata.uid for s in listed.sessions]
            # Writable again: the host's own probe brings Sessions back.
            await health.until(SERVING)
        finally:
            health.cancel()
    frames, code, details = await _turn(host, uid)
    assert code == grpc.StatusCode.OK, details
    replayed = [r async for r in host.sessions.Replay(session_pb2.ReplayRequest(session=uid), timeout=WAIT_S)]
    # Every record acknowledged before the outage is there, verbatim.
    assert replayed[: len(acknowledged)] == acknowledged
    assert replayed[-1].event.kind == common_pb2.EVENT_END


@pytest.fixture
async def sqlite_host(tmp_path: Path) -> AsyncIterator[tuple[HostProcess, Path]]:
    if not _chattr_works(tmp_path):
        pytest.skip("chattr +i is not available or not enforced here (needs CAP_LINUX_IMMUTABLE on ext4/xfs)")
    journal = tmp_path / "journal.db"
    host = HostProcess(journal, tmp_path)
    await host.start()
    try:
        yield host, journal
    finally:
        _release(tmp_path)
        await host.close()


async def test_an_immutable_sqlite_journal_is_unavailable_until_it_is_writable(
    sqlite_host: tuple[HostProcess, Path],
) -> None:
    host, journal = sqlite_host

    @contextlib.asynccontextmanager
    async def refuse() -> AsyncIterator[None]:
        # Not the -shm file: SQLite maps it into memory, and a refused page fault is a SIGBUS.
        with immutable([journal, journal.with_name("journal.db-wal")]):
            yield

    await _unwritable_then_writable(host, refuse())
    await host.stop()
    store = await open_store(str(journal))
    try:
        for uid in await store.session_uids():
            assert await store.verify(uid) == len(await store.read(uid))
    finally:
        await store.close()


@pytest.mark.postgres
async def test_a_postgres_journal_whose_role_loses_write_privilege(pg_url: str, tmp_path: Path) -> None:
    role = "journal_writer_" + secrets.token_hex(4)
    admin = await asyncpg.connect(pg_url)
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN")
        await admin.execute(f"GRANT CREATE, USAGE ON SCHEMA public TO {role}")
        database = await admin.fetchval("SELECT current_database()")
        await admin.execute(f'GRANT CREATE ON DATABASE "{database}" TO {role}')
    finally:
        await admin.close()
    host_url = pg_url.replace("://postgres@", f"://{role}@", 1)
    host = HostProcess(host_url, tmp_path)
    await host.start()

    @contextlib.asynccontextmanager
    async def refuse() -> AsyncIterator[None]:
        conn = await asyncpg.connect(pg_url)
        try:
            # The host's role owns the tables it created: take its write privilege away.
            await conn.execute(f"REVOKE INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public FROM {role}")
            yield
            await conn.execute(f"GRANT INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}")
        finally:
            await conn.close()

    try:
        await _unwritable_then_writable(host, refuse())
    finally:
        await host.close()
        admin = await asyncpg.connect(pg_url)
        try:
            await admin.execute(f"DROP OWNED BY {role}")
            await admin.execute(f"DROP ROLE {role}")
        finally:
            await admin.close()


async def test_a_turn_cut_short_by_the_outage_is_completed_by_resume(
    sqlite_host: tuple[HostProcess, Path],
) -> None:
    """The journal turns unwritable between a turn's first records and its model call: the call
    is never made (intent comes first), the turn is left interrupted, and Resume completes it once
    the journal takes writes again, with exactly one model call."""
    host, journal = sqlite_host
    entered, release = asyncio.Event(), asyncio.Event()

    async def script(conversation: Conversation) -> None:
        entered.set()
        await asyncio.wait_for(release.wait(), WAIT_S)
        ask = common_pb2.ModelCall(
            model="echo",
            messages=[
                common_pb2.Message(role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text="hi"))])
            ],
        )
        conversation.send(common_pb2.Event(kind=common_pb2.EVENT_MODEL_CALL, model=ask))
        if await conversation.recv() is None:
            return  # the host ended the stream: the turn stops here
        conversation.send(
            common_pb2.Event(kind=common_pb2.EVENT_END, end=common_pb2.HarnessEnd(state="COMPLETED"))
        )

    async with raw_peer(script) as (address, _):
        await host.stop()
        host.args = ["--harness", f"gated={address}"]
        await host.start()
        created = await host.sessions.CreateSession(
            session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="gated")), timeout=WAIT_S
        )
        uid = created.metadata.uid
        turn = asyncio.create_task(_turn(host, uid))
        await asyncio.wait_for(entered.wait(), WAIT_S)
        async with grpc.aio.insecure_channel(host.address) as channel:
            health = HealthWatch(channel)
            try:
                with immutable([journal, journal.with_name("journal.db-wal")]):
                    release.set()
                    _, code, details = await turn
                    assert code == grpc.StatusCode.UNAVAILABLE, details
                    assert "journal not writable" in details
                    kinds = [
                        common_pb2.EventKind.Name(r.event.kind)
                        async for r in host.sessions.Replay(
                            session_pb2.ReplayRequest(session=uid), timeout=WAIT_S
                        )
                    ]
                    assert kinds == ["EVENT_EXECUTION_START", "EVENT_INPUT"], "no MODEL_CALL: no model call"
                await health.until(SERVING)
            finally:
                health.cancel()
        resumed = await host.sessions.Resume(session_pb2.ResumeRequest(session=uid), timeout=WAIT_S)
        assert resumed.exec_state == session_pb2.EXEC_COMPLETED
        records = [
            r async for r in host.sessions.Replay(session_pb2.ReplayRequest(session=uid), timeout=WAIT_S)
        ]
        kinds = [common_pb2.EventKind.Name(r.event.kind) for r in records]
        assert kinds.count("EVENT_MODEL_CALL") == 1 and kinds.count("EVENT_OUTPUT") == 1
        assert "EVENT_END" in kinds
