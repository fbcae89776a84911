"""Describe once per harness connection (issue #13 item 2): the host keeps the descriptor a remote
harness gave on the channel's current connection, and Describes again when that connection ends
(a new process at the address), when the descriptor is older than its maximum age, or always with a
maximum age of 0 (the reference's Describe at every admission)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentsessions.host.controller.harnesses import ResolvedHarness, describe
from agentsessions.host.harnesslink import RemoteHarness
from agentsessions.sdk import EventSink, Start
from agentsessions.sdk.serving import start_server
from agentsessions.v1 import common_pb2, harness_pb2, session_pb2
from tests.chaos.scenario import wait_until
from tests.support.host_process import HarnessProcess, HostProcess
from tests.support.versioned_harness import VERSION_FILE

LIMIT_S = 30.0


class CountingHarness:
    """Counts the Describe calls that reach it."""

    def __init__(self, version: str = "1") -> None:
        self.version = version
        self.describes = 0

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        self.describes += 1
        return harness_pb2.HarnessDescriptor(id="counting", version=self.version)

    async def run(self, start: Start, sink: EventSink) -> None:
        await sink.output("ok")


async def test_one_describe_serves_admissions_on_one_connection(tmp_path: Path) -> None:
    harness = CountingHarness()
    server = await start_server(harness, f"unix:{tmp_path}/h.sock")
    link = RemoteHarness(server.address, describe_max_age=3600)
    try:
        for _ in range(5):
            assert (await link.describe()).version == "1"
        assert harness.describes == 1
    finally:
        await link.close()
        await server.stop(None)


async def test_admission_takes_the_current_descriptor_without_asking_and_asks_once_it_is_not(
    tmp_path: Path,
) -> None:
    harness = CountingHarness()
    address = f"unix:{tmp_path}/h.sock"
    server = await start_server(harness, address)
    link = RemoteHarness(address, describe_max_age=3600)
    resolved = ResolvedHarness("counting", link, registered=True, in_process=False)
    try:
        assert link.current_descriptor() is None  # nothing described yet: admission asks
        assert (await describe(resolved)).version == "1"
        assert link.current_descriptor() is not None
        for _ in range(3):
            assert (await describe(resolved)).version == "1"
        assert harness.describes == 1
        first = link.connection()
        await server.stop(None)
        await wait_until("the link to see the old connection go", lambda: link.connection() != first)
        assert link.current_descriptor() is None  # its connection is gone
        server = await start_server(CountingHarness("2"), address)
        assert (await describe(resolved)).version == "2"
    finally:
        await link.close()
        await server.stop(None)


async def test_a_max_age_of_zero_describes_at_every_admission(tmp_path: Path) -> None:
    harness = CountingHarness()
    server = await start_server(harness, f"unix:{tmp_path}/h.sock")
    link = RemoteHarness(server.address, describe_max_age=0)
    try:
        for _ in range(3):
            await link.describe()
        assert link.current_descriptor() is None
        assert harness.describes == 3
    finally:
        await link.close()
        await server.stop(None)


async def test_a_new_server_at_the_address_is_described_again(tmp_path: Path) -> None:
    address = f"unix:{tmp_path}/h.sock"
    old, new = CountingHarness("1"), CountingHarness("2")
    server = await start_server(old, address)
    link = RemoteHarness(address, describe_max_age=3600)
    try:
        assert (await link.describe()).version == "1"
        first = link.connection()
        await server.stop(None)
        # The link notices the old process's connection going (grpc tells it asynchronously: under
        # load a describe right after the stop could still find the channel READY on it).
        await wait_until("the link to see the old connection go", lambda: link.connection() != first)
        server = await start_server(new, address)
        assert (await link.describe()).version == "2"
        assert (old.describes, new.describes) == (1, 1)
    finally:
        await link.close()
        await server.stop(None)


def say(uid: str, text: str) -> session_pb2.ExecRequest:
    part = common_pb2.Part(text=common_pb2.TextPart(text=text))
    return session_pb2.ExecRequest(session=uid, inputs=[common_pb2.Message(role="user", parts=[part])])


async def started_version(host: HostProcess, uid: str) -> tuple[str, str]:
    """One turn: the harness version its EXECUTION_START records, and what the harness answered."""
    version, output = "", ""
    async with asyncio.timeout(LIMIT_S):
        async for update in host.sessions.Exec(say(uid, "hi")):
            event = update.record.event
            if event.kind == common_pb2.EVENT_EXECUTION_START:
                version = event.execution_start.harness_version
            elif event.kind == common_pb2.EVENT_OUTPUT:
                output = event.message.parts[0].text.text
    return version, output


async def test_an_upgraded_harness_process_is_noticed_before_its_first_turn(tmp_path: Path) -> None:
    address = f"unix:{tmp_path}/harness.sock"
    (tmp_path / VERSION_FILE).write_text("1")
    harness = HarnessProcess("tests.support.versioned_harness:VersionedHarness", address, tmp_path)
    # A maximum age far beyond the test: only the connection ending can make the host Describe again.
    host = HostProcess(
        tmp_path / "journal.db",
        tmp_path,
        ["--harness", f"versioned={address}", "--harness-describe-max-age", "3600"],
    )
    try:
        await harness.start()
        await host.start()
        created = await host.sessions.CreateSession(
            session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="versioned"))
        )
        uid = created.metadata.uid
        assert await started_version(host, uid) == ("1", "version 1")
        assert await started_version(host, uid) == ("1", "version 1")
        await harness.kill()
        (tmp_path / VERSION_FILE).write_text("2")
        await harness.start()
        assert await started_version(host, uid) == ("2", "version 2")
    finally:
        await host.close()
        await harness.close()
