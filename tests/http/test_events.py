"""``GET /api/v1/sessions/{uid}/events``: Server-Sent Events whose ids are record seqs.

A 10-record session (two echo turns) read from ``Last-Event-ID: 3`` gives ids 4..10, in order, each
once; a reconnect from the last id gives exactly the records written since. Following live needs
``LiveSessions.Watch``; those tests skip, saying so, on a host that does not serve it yet.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from tests.http.conftest import Served, create, http_host, turn

API = "/api/v1"
READ_LIMIT_S = 30.0


@dataclass
class Event:
    name: str
    data: dict[str, object]
    id: str | None


async def events(lines: AsyncIterator[str]) -> AsyncIterator[Event | int]:
    """Parse an SSE stream: each event, and the ``retry:`` value (an int) when one comes."""
    name, event_id = "message", None
    data: list[str] = []
    async for line in lines:
        if line == "":
            if data:
                yield Event(name, json.loads("\n".join(data)), event_id)
            name, data, event_id = "message", [], None
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
            elif field == "id":
                event_id = value
            elif field == "retry":
                yield int(value)


async def read_all(host: Served, uid: str, headers: dict[str, str], **params: str) -> tuple[list[Event], int]:
    """Read a stream that ends by itself (follow=false): its events and its retry value."""
    got: list[Event] = []
    retry = 0
    async with host.http.stream(
        "GET", f"{API}/sessions/{uid}/events", headers=headers, params={"follow": "false", **params}
    ) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["Content-Type"].startswith("text/event-stream")
        async with asyncio.timeout(READ_LIMIT_S):
            async for item in events(response.aiter_lines()):
                if isinstance(item, int):
                    retry = item
                else:
                    got.append(item)
    return got, retry


def ids(got: list[Event]) -> list[str | None]:
    return [event.id for event in got if event.name == "record"]


async def ten_records(host: Served) -> str:
    uid = await create(host.http)
    await turn(host.http, uid, "hi")
    await turn(host.http, uid, "bye")
    return uid


async def test_last_event_id_3_of_10_records_gives_4_to_10() -> None:
    async with http_host() as host:
        uid = await ten_records(host)
        got, retry = await read_all(host, uid, {"Last-Event-ID": "3"})
        assert retry == 2000
        assert got[0].name == "session" and got[0].data["lastSeq"] == "10"
        assert ids(got) == [str(seq) for seq in range(4, 11)]
        for event in got:
            if event.name == "record":
                assert event.data["seq"] == event.id
        assert got[-1].name == "end"

        # ?after_seq does the same; a Last-Event-ID (a reconnect) wins over it.
        by_parameter, _ = await read_all(host, uid, {}, after_seq="8")
        assert ids(by_parameter) == ["9", "10"]
        both, _ = await read_all(host, uid, {"Last-Event-ID": "6"}, after_seq="1")
        assert ids(both) == ["7", "8", "9", "10"]
        everything, _ = await read_all(host, uid, {})
        assert ids(everything) == [str(seq) for seq in range(1, 11)]


async def test_records_carry_proto_names_for_hash_checks() -> None:
    async with http_host() as host:
        uid = await ten_records(host)
        got, _ = await read_all(host, uid, {"Last-Event-ID": "9"}, json_names="proto")
        record = next(event.data for event in got if event.name == "record")
        assert {"seq", "prev_hash", "content_hash", "event"} <= set(record)


async def test_a_reconnect_resumes_exactly_after_its_last_event_id() -> None:
    async with http_host() as host:
        uid = await ten_records(host)
        first, _ = await read_all(host, uid, {})
        last = ids(first)[-1]
        assert last == "10"
        await turn(host.http, uid, "once more")
        again, _ = await read_all(host, uid, {"Last-Event-ID": str(last)})
        assert ids(again) == [str(seq) for seq in range(11, 16)]
        kinds = [event.data["event"]["kind"] for event in again if event.name == "record"]  # type: ignore[index]
        assert kinds[0] == "EVENT_EXECUTION_START" and kinds[-1] == "EVENT_END"


async def test_an_unknown_session_is_404_before_any_event() -> None:
    async with http_host() as host:
        answer = await host.http.get(f"{API}/sessions/sess-000000000000000000000000/events")
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "NOT_FOUND"


async def test_curl_n_with_last_event_id_3(tmp_path: object) -> None:
    """The command docs/http.md shows, run for real."""
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    async with http_host() as host:
        uid = await ten_records(host)
        process = await asyncio.create_subprocess_exec(
            curl,
            "-sN",
            "-H",
            "Last-Event-ID: 3",
            f"{host.base_url}{API}/sessions/{uid}/events?follow=false",
            stdout=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(READ_LIMIT_S):
            out, _ = await process.communicate()
        assert process.returncode == 0
        printed = [line.removeprefix("id: ") for line in out.decode().splitlines() if line.startswith("id: ")]
        assert printed == [str(seq) for seq in range(4, 11)]


async def test_following_live_stays_open_for_new_records() -> None:
    async with http_host() as host:
        uid = await ten_records(host)
        seen: list[str | None] = []
        async with host.http.stream(
            "GET", f"{API}/sessions/{uid}/events", headers={"Last-Event-ID": "3"}, timeout=httpx.Timeout(None)
        ) as response:
            assert response.status_code == 200
            stream = events(response.aiter_lines())
            async with asyncio.timeout(READ_LIMIT_S):
                while len(seen) < 7:
                    item = await anext(stream)
                    if isinstance(item, Event) and item.name == "record":
                        seen.append(item.id)
                assert seen == [str(seq) for seq in range(4, 11)]
                # The stream is still open: a new turn's records arrive on it.
                writing = asyncio.create_task(turn(host.http, uid, "live"))
                while len(seen) < 12:
                    item = await anext(stream)
                    assert not (isinstance(item, Event) and item.name == "end"), "the stream ended"
                    if isinstance(item, Event) and item.name == "record":
                        seen.append(item.id)
                await writing
        assert seen == [str(seq) for seq in range(4, 16)]
