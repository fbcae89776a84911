"""The HTTP API's JSON routes against a real host (``agentsessions serve --http-listen``): each
answer is the gRPC answer of the same host in proto3 JSON, each refusal the gRPC status mapped by
the one table of ``agentsessions.host.http.status``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from agentsessions.host.http.status import HTTP_STATUS
from agentsessions.sdk.server import HarnessServer
from agentsessions.v1 import session_pb2
from tests.approvals.harnesses import BlockingHarness
from tests.http.conftest import STAMP, create, exec_lines, http_host, refusal, turn, user_input
from tests.support.outcome import call_outcome

API = "/api/v1"


async def grpc_code(call: Any) -> grpc.StatusCode:
    """The status code a gRPC call on the same host ends with (OK when it succeeds)."""
    code, _ = await call_outcome(call)
    return code


def test_every_grpc_code_has_an_http_status() -> None:
    assert set(HTTP_STATUS) == set(grpc.StatusCode)
    assert HTTP_STATUS[grpc.StatusCode.INVALID_ARGUMENT] == 400
    assert HTTP_STATUS[grpc.StatusCode.UNAUTHENTICATED] == 401
    assert HTTP_STATUS[grpc.StatusCode.PERMISSION_DENIED] == 403
    assert HTTP_STATUS[grpc.StatusCode.NOT_FOUND] == 404
    assert HTTP_STATUS[grpc.StatusCode.ABORTED] == HTTP_STATUS[grpc.StatusCode.ALREADY_EXISTS] == 409
    assert HTTP_STATUS[grpc.StatusCode.FAILED_PRECONDITION] == 409
    assert HTTP_STATUS[grpc.StatusCode.RESOURCE_EXHAUSTED] == 429
    assert HTTP_STATUS[grpc.StatusCode.UNAVAILABLE] == 503


async def test_a_session_over_http_is_the_grpc_session() -> None:
    async with http_host() as host:
        created = await host.http.post(
            f"{API}/sessions", json={"session": {"metadata": {"name": "web"}, "labels": {"team": "docs"}}}
        )
        assert created.status_code == 200, created.text
        assert created.headers["Content-Type"].startswith("application/json")
        uid = created.json()["metadata"]["uid"]
        assert created.json()["labels"] == {"team": "docs"} and created.json()["execState"] == "EXEC_PENDING"

        status, lines = await exec_lines(
            host.http, f"{API}/sessions/{uid}/exec", {"inputs": [user_input("hi")]}
        )
        assert status == 200
        assert "session" in lines[0]
        records = [line["record"] for line in lines if "record" in line]
        assert [r["seq"] for r in records] == ["1", "2", "3", "4", "5"]
        assert [r["event"]["kind"] for r in records][-2:] == ["EVENT_OUTPUT", "EVENT_END"]
        assert any("delta" in line for line in lines)

        # GET is the gRPC GetSession answer, field for field.
        shown = await host.http.get(f"{API}/sessions/{uid}")
        over_grpc = await host.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid))
        assert json_format.ParseDict(shown.json(), session_pb2.Session()) == over_grpc
        assert shown.json()["lastSeq"] == "5" and shown.json()["execState"] == "EXEC_COMPLETED"
        snake = (await host.http.get(f"{API}/sessions/{uid}", params={"json_names": "proto"})).json()
        assert snake["last_seq"] == "5" and snake["exec_state"] == "EXEC_COMPLETED"

        # Records are Sessions.Replay, verbatim; verify recomputes the chain from them.
        async with host.http.stream("GET", f"{API}/sessions/{uid}/records", params={"from_seq": 2}) as replay:
            assert replay.headers["Content-Type"].startswith("application/x-ndjson")
            stored = [json.loads(line) async for line in replay.aiter_lines() if line]
        assert stored == records[1:]
        verified = (await host.http.get(f"{API}/sessions/{uid}/verify")).json()
        assert verified == {
            "session": uid,
            "verified": True,
            "records": 5,
            "headHash": records[-1]["contentHash"],
        }

        listed = (await host.http.get(f"{API}/sessions")).json()
        assert [s["metadata"]["uid"] for s in listed["sessions"]] == [uid]


async def test_fork_suspend_resume_delete() -> None:
    async with http_host() as host:
        uid = await create(host.http)
        await turn(host.http, uid, "hi")
        forked = await host.http.post(
            f"{API}/sessions/{uid}/fork", json={"atSeq": 5, "count": 2, "childNames": ["left", "right"]}
        )
        assert forked.status_code == 200, forked.text
        children = forked.json()["children"]
        assert [c["metadata"]["name"] for c in children] == ["left", "right"]
        assert {c["parentUid"] for c in children} == {uid} and {c["forkSeq"] for c in children} == {"5"}

        suspended = await host.http.post(f"{API}/sessions/{uid}/suspend")
        assert suspended.json()["computeState"] == "COMPUTE_COLD"
        resumed = await host.http.post(f"{API}/sessions/{uid}/resume", json={})
        assert resumed.json()["computeState"] == "COMPUTE_LIVE"

        child = children[0]["metadata"]["uid"]
        deleted = await host.http.delete(f"{API}/sessions/{child}")
        assert deleted.status_code == 200 and deleted.json()["metadata"]["uid"] == child
        gone = await host.http.get(f"{API}/sessions/{child}")
        assert refusal(gone)[:2] == (404, "NOT_FOUND")
        assert await grpc_code(host.sessions.GetSession(session_pb2.GetSessionRequest(uid=child))) == (
            grpc.StatusCode.NOT_FOUND
        )


async def test_refusals_name_the_field_and_match_grpc() -> None:
    async with http_host() as host:
        uid = await create(host.http)
        await turn(host.http, uid, "hi")
        post = host.http.post

        not_json = await post(f"{API}/sessions", content=b"{", headers={"Content-Type": "application/json"})
        status, code, message = refusal(not_json)
        assert (status, code) == (400, "INVALID_ARGUMENT") and message.startswith("request body: not JSON")

        for body, content_type, start in (
            (b'{"session": "\xff"}', "application/json", "request body: not utf-8"),
            (b"{}", "application/json; charset=bogus", "Content-Type: unknown charset 'bogus'"),
            (b"[" * 100_000 + b"]" * 100_000, "application/json", "request body: JSON nested too deeply"),
            (b'{"session": ' * 120 + b"{}" + b"}" * 120, "application/json", "request body:"),
        ):
            bad = await post(f"{API}/sessions", content=body, headers={"Content-Type": content_type})
            status, code, message = refusal(bad)
            assert (status, code) == (400, "INVALID_ARGUMENT") and message.startswith(start), message

        unknown = await post(f"{API}/sessions", json={"session": {"bogus": 1}})
        status, code, message = refusal(unknown)
        assert (status, code) == (400, "INVALID_ARGUMENT") and '"bogus"' in message

        form = await post(f"{API}/sessions", content=b"session=x", headers={"Content-Type": "text/plain"})
        status, code, message = refusal(form)
        assert (status, code) == (415, "INVALID_ARGUMENT") and message.startswith("Content-Type:")

        other = await post(f"{API}/sessions/{uid}/cancel", json={"session": "sess-000000000000000000000000"})
        status, code, message = refusal(other)
        assert (status, code) == (400, "INVALID_ARGUMENT") and message.startswith("session: the body names")

        page = await host.http.get(f"{API}/sessions", params={"page_size": "abc"})
        status, code, message = refusal(page)
        assert (status, code) == (400, "INVALID_ARGUMENT") and "page_size" in message
        state = await host.http.get(f"{API}/sessions", params={"state": "SLEEPING"})
        assert refusal(state)[:2] == (400, "INVALID_ARGUMENT") and "state:" in refusal(state)[2]

        # Validation, not found, stale head and no pending approval: the gRPC codes, mapped.
        bad_uid = await host.http.get(f"{API}/sessions/{'x' * 300}")
        over_grpc = await grpc_code(host.sessions.GetSession(session_pb2.GetSessionRequest(uid="x" * 300)))
        assert over_grpc == grpc.StatusCode.INVALID_ARGUMENT
        assert refusal(bad_uid)[:2] == (400, "INVALID_ARGUMENT")
        missing = await host.http.get(f"{API}/sessions/sess-000000000000000000000000")
        assert refusal(missing)[:2] == (404, "NOT_FOUND")

        status, lines = await exec_lines(
            host.http, f"{API}/sessions/{uid}/exec", {"expectedLastSeq": 3, "inputs": [user_input("late")]}
        )
        # As on gRPC: the Session frame, then ABORTED (sent as the last line once the stream began).
        assert status == 200 and "session" in lines[0] and lines[-1]["error"]["code"] == "ABORTED", lines
        stale = session_pb2.ExecRequest(session=uid, expected_last_seq=3, inputs=[])
        assert await grpc_code(host.sessions.Exec(stale)) == grpc.StatusCode.ABORTED

        approve = {"executionId": "e", "toolCallId": "t", "requestSeq": 1, "approved": True}
        refused = await post(f"{API}/sessions/{uid}/approve", json=approve)
        assert refusal(refused)[:2] == (409, "FAILED_PRECONDITION")
        request = session_pb2.ApproveRequest(session=uid, execution_id="e", tool_call_id="t", request_seq=1)
        request.approved = True
        assert await grpc_code(host.sessions.Approve(request)) == grpc.StatusCode.FAILED_PRECONDITION

        unset = await post(f"{API}/sessions/{uid}/approve", json={"executionId": "e"})
        assert refusal(unset)[:2] == (400, "INVALID_ARGUMENT") and "tool_call_id" in refusal(unset)[2]

        no_route = await host.http.get(f"{API}/nothing-here")
        assert refusal(no_route)[:2] == (404, "NOT_FOUND")
        wrong_method = await host.http.put(f"{API}/sessions/{uid}")
        assert refusal(wrong_method)[:2] == (405, "UNIMPLEMENTED") and "GET" in wrong_method.headers["Allow"]


async def test_state_filter_and_paging_visit_each_session_once() -> None:
    async with http_host() as host:
        uids = [await create(host.http, metadata={"name": f"s{i}"}) for i in range(5)]
        for uid in uids[1:3]:
            await turn(host.http, uid, "hi")

        seen: list[str] = []
        token = ""
        for _ in range(10):
            page = (
                await host.http.get(f"{API}/sessions", params={"page_size": 2, "page_token": token})
            ).json()
            seen += [s["metadata"]["uid"] for s in page["sessions"]]
            token = page.get("nextPageToken", "")
            if not token:
                break
        assert sorted(seen) == sorted(uids) and len(seen) == 5

        async def in_state(state: str) -> list[str]:
            found: list[str] = []
            token = ""
            for _ in range(10):
                params: dict[str, str | int] = {"state": state, "page_size": 1, "page_token": token}
                page = (await host.http.get(f"{API}/sessions", params=params)).json()
                assert {s["execState"] for s in page.get("sessions", [])} <= {f"EXEC_{state}"}
                found += [s["metadata"]["uid"] for s in page.get("sessions", [])]
                token = page.get("nextPageToken", "")
                if not token:
                    return found
            raise AssertionError("paging did not end")

        assert sorted(await in_state("COMPLETED")) == sorted(uids[1:3])
        assert sorted(await in_state("PENDING")) == sorted(uids[:1] + uids[3:])
        assert await in_state("AWAITING") == []


async def test_an_approval_round_trip_over_http(tooler: HarnessServer) -> None:
    async with http_host(harnesses=[("tooler", tooler.address)], tool_executors=[STAMP]) as host:
        uid = await create(host.http, harness="tooler")
        status, lines = await exec_lines(
            host.http, f"{API}/sessions/{uid}/exec", {"inputs": [user_input("hi")]}
        )
        assert status == 200
        parked = [line["session"] for line in lines if "session" in line][-1]
        pending = parked["pendingApproval"]
        assert parked["execState"] == "EXEC_AWAITING"

        decided = await host.http.post(
            f"{API}/sessions/{uid}/approve", json={**pending, "approved": True, "reason": "fine"}
        )
        assert decided.status_code == 200, decided.text
        decision = decided.json()["decision"]
        assert decision["event"]["kind"] == "EVENT_APPROVAL_RESULT"
        assert decision["event"]["approvalResult"]["reason"] == "fine"

        status, rest = await exec_lines(host.http, f"{API}/sessions/{uid}/exec", {})
        assert status == 200
        kinds = [line["record"]["event"]["kind"] for line in rest if "record" in line]
        assert "EVENT_TOOL_RESULT" in kinds and kinds[-1] in ("EVENT_END", "EVENT_LIFECYCLE"), kinds
        result = next(
            line["record"]["event"]["result"]
            for line in rest
            if "result" in line.get("record", {}).get("event", {})
        )
        assert result["output"] == {"stamped": "echo:hi"}
        assert (await host.http.get(f"{API}/sessions/{uid}")).json()["execState"] == "EXEC_COMPLETED"


async def test_cancel_stops_a_turn_streaming_over_http(
    blocker: tuple[BlockingHarness, HarnessServer],
) -> None:
    harness, served = blocker
    async with http_host(harnesses=[("blocker", served.address)]) as host:
        uid = await create(host.http, harness="blocker")
        lines: list[dict[str, Any]] = []

        async def run() -> int:
            path = f"{API}/sessions/{uid}/exec"
            async with host.http.stream("POST", path, json={"inputs": [user_input("go")]}) as response:
                async for line in response.aiter_lines():
                    if line:
                        lines.append(json.loads(line))
                return response.status_code

        running = asyncio.create_task(run())
        async with asyncio.timeout(30):
            await harness.entered.wait()
        cancelled = await host.http.post(f"{API}/sessions/{uid}/cancel", json={"reason": "enough"})
        assert cancelled.status_code == 200, cancelled.text
        async with asyncio.timeout(30):
            assert await running == 200
        ends = [
            line["record"]["event"] for line in lines if "record" in line and "end" in line["record"]["event"]
        ]
        assert [end["end"]["state"] for end in ends] == ["CANCELED"], lines
        assert (await host.http.get(f"{API}/sessions/{uid}")).json()["execState"] == "EXEC_CANCELED"


async def test_submit_is_live_sessions_submit() -> None:
    """Submit maps to LiveSessions.Submit: the turn runs without the caller, and its records can be read."""
    async with http_host() as host:
        uid = await create(host.http)
        answer = await host.http.post(
            f"{API}/sessions/{uid}/submit", json={"exec": {"inputs": [user_input("hi")]}}
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["session"]["metadata"]["uid"] == uid
        assert body["executionId"] and body["startSeq"] == "1"


async def test_browser_rules_and_headers() -> None:
    async with http_host() as host:
        port = host.base_url.rpartition(":")[2]
        own = await host.http.get(f"{API}/sessions", headers={"Origin": host.base_url})
        assert own.status_code == 200
        for name in ("Content-Security-Policy", "X-Content-Type-Options", "X-Frame-Options"):
            assert name in own.headers
        assert own.headers["Cache-Control"] == "no-store"

        foreign = await host.http.post(
            f"{API}/sessions", json={"session": {}}, headers={"Origin": "https://evil.example"}
        )
        assert refusal(foreign)[:2] == (403, "PERMISSION_DENIED")
        cross = await host.http.get(f"{API}/sessions", headers={"Sec-Fetch-Site": "cross-site"})
        assert refusal(cross)[:2] == (403, "PERMISSION_DENIED")
        rebound = await host.http.get(f"{API}/sessions", headers={"Host": f"evil.example:{port}"})
        assert refusal(rebound)[:2] == (403, "PERMISSION_DENIED") and "Host:" in refusal(rebound)[2]
        assert (
            await host.http.get(f"{API}/sessions", headers={"Host": f"localhost:{port}"})
        ).status_code == 200
        listed = (await host.http.get(f"{API}/sessions")).json()
        assert listed == {}  # nothing was created by the refused requests

        page = await host.http.get("/")
        assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
        assert '<script type="module" src="/console/app.js">' in page.text
        script = await host.http.get("/console/app.js")
        assert script.headers["Content-Type"].startswith("text/javascript")
        assert (await host.http.get("/console/nothing.js")).status_code == 404


async def test_request_ids_are_the_grpc_ones_and_health_is_open() -> None:
    async with http_host() as host:
        answer = await host.http.get(f"{API}/sessions", headers={"X-Request-Id": "trace-42"})
        assert answer.headers["x-request-id"] == "trace-42"
        minted = await host.http.get(f"{API}/sessions")
        assert len(minted.headers["x-request-id"]) == 32
        health = await host.http.get("/healthz")
        assert (health.status_code, health.json()) == (200, {"status": "SERVING"})


@pytest.mark.parametrize("header", ["abc", "-1", "99999999999999999999"])
async def test_a_bad_last_event_id_is_invalid_argument(header: str) -> None:
    async with http_host() as host:
        uid = await create(host.http)
        answer = await host.http.get(f"{API}/sessions/{uid}/events", headers={"Last-Event-ID": header})
        status, code, message = refusal(answer)
        assert (status, code) == (400, "INVALID_ARGUMENT") and message.startswith("Last-Event-ID:")
