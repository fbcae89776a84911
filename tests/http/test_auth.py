"""Authentication and authorization over HTTP are the gRPC ones (``--auth-tokens``): the HTTP
layer forwards the Authorization headers to the host's own interceptors, so each refusal is the
gRPC refusal of the same call, mapped to its HTTP status."""

from __future__ import annotations

import grpc
import httpx

from agentsessions.client import bearer_metadata
from agentsessions.host.config import ConfigError, HostConfig
from agentsessions.sdk.server import HarnessServer
from agentsessions.v1 import common_pb2, session_pb2
from tests.http.conftest import (
    ALICE,
    BOB,
    CAROL,
    STAMP,
    bearer,
    create,
    exec_lines,
    http_host,
    refusal,
    turn,
    user_input,
)
from tests.support.outcome import call_outcome

API = "/api/v1"


async def test_no_token_or_a_wrong_one_is_401(tokens_file: str) -> None:
    async with http_host(auth_tokens=tokens_file) as host:
        get = session_pb2.GetSessionRequest(uid="sess-000000000000000000000000")
        cases = [
            ({}, ()),
            (bearer("not-a-known-token-at-all"), bearer_metadata("not-a-known-token-at-all")),
            ({"Authorization": f"Basic {ALICE}"}, (("authorization", f"Basic {ALICE}"),)),
        ]
        for headers, metadata in cases:
            answer = await host.http.get(f"{API}/sessions/sess-000000000000000000000000", headers=headers)
            status, code, message = refusal(answer)
            assert (status, code) == (401, "UNAUTHENTICATED"), answer.text
            assert answer.headers["WWW-Authenticate"].startswith("Bearer")
            assert "not-a-known-token" not in message
            # The same words gRPC answers the same call with.
            assert await call_outcome(host.sessions.GetSession(get, metadata=metadata)) == (
                grpc.StatusCode.UNAUTHENTICATED,
                message,
            )
        listed = await host.http.get(f"{API}/sessions", headers=bearer("not-a-known-token-at-all"))
        assert refusal(listed)[:2] == (401, "UNAUTHENTICATED")
        events = await host.http.get(f"{API}/sessions/sess-000000000000000000000000/events")
        assert refusal(events)[:2] == (401, "UNAUTHENTICATED")
        # Health and the console's own files need no token.
        assert (await host.http.get("/healthz")).status_code == 200
        assert (await host.http.get("/")).status_code == 200


async def test_roles_and_projects_are_the_grpc_rules(tokens_file: str) -> None:
    async with http_host(auth_tokens=tokens_file) as host:
        uid = await create(host.http, bearer(ALICE), metadata={"name": "alices"})
        await turn(host.http, uid, "hi", bearer(ALICE))

        # Bob reads the default project but may not write in it.
        assert (await host.http.get(f"{API}/sessions/{uid}", headers=bearer(BOB))).status_code == 200
        denied = await host.http.post(f"{API}/sessions", json={"session": {}}, headers=bearer(BOB))
        status, code, message = refusal(denied)
        assert (status, code) == (403, "PERMISSION_DENIED")
        assert (
            message
            == "principal 'user:bob' lacks role 'writer', needed for agentsessions.v1.Sessions/CreateSession"
        )

        # Carol's project is payments: alice's session is foreign to her, and a foreign session
        # answers exactly as an unknown one does, on every route and over gRPC alike.
        unknown = "sess-000000000000000000000000"
        foreign = await host.http.get(f"{API}/sessions/{uid}", headers=bearer(CAROL))
        missing = await host.http.get(f"{API}/sessions/{unknown}", headers=bearer(CAROL))
        status, code, message = refusal(foreign)
        assert (status, code) == (404, "NOT_FOUND")
        assert message == refusal(missing)[2].replace(unknown, uid)
        request = session_pb2.GetSessionRequest(uid=uid)
        assert await call_outcome(host.sessions.GetSession(request, metadata=bearer_metadata(CAROL))) == (
            grpc.StatusCode.NOT_FOUND,
            message,
        )
        # Listing a project that is not hers is refused outright: it names no session.
        listing = await host.http.get(f"{API}/sessions", headers=bearer(CAROL))
        assert refusal(listing)[:2] == (403, "PERMISSION_DENIED")
        fork = await host.http.post(f"{API}/sessions/{uid}/fork", json={}, headers=bearer(CAROL))
        assert refusal(fork)[:2] == (404, "NOT_FOUND")
        status_code, lines = await exec_lines(
            host.http, f"{API}/sessions/{uid}/exec", {"inputs": [user_input("mine now")]}, bearer(CAROL)
        )
        assert status_code == 404 and lines[0]["error"]["code"] == "NOT_FOUND"

        # The events of a foreign session are refused as reading it is.
        events = await host.http.get(f"{API}/sessions/{uid}/events", headers=bearer(CAROL))
        assert refusal(events)[:2] == (404, "NOT_FOUND")
        # And nothing was journaled by any refusal.
        assert (await host.http.get(f"{API}/sessions/{uid}", headers=bearer(ALICE))).json()["lastSeq"] == "5"


async def test_repeated_authorization_headers_answer_as_grpc_does(tokens_file: str) -> None:
    """Every Authorization header reaches the interceptor, which decides what two of them mean."""
    async with http_host(auth_tokens=tokens_file) as host:
        uid = await create(host.http, bearer(ALICE))
        headers = httpx.Headers([("Authorization", f"Bearer {ALICE}"), ("Authorization", f"Bearer {BOB}")])
        over_http = await host.http.get(f"{API}/sessions/{uid}", headers=headers)
        metadata = (("authorization", f"Bearer {ALICE}"), ("authorization", f"Bearer {BOB}"))
        code, _ = await call_outcome(
            host.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid), metadata=metadata)
        )
        expected = {grpc.StatusCode.OK: 200, grpc.StatusCode.UNAUTHENTICATED: 401}[code]
        assert over_http.status_code == expected, over_http.text


async def test_an_approval_is_journaled_with_the_signed_in_principal(
    tokens_file: str, tooler: HarnessServer
) -> None:
    async with http_host(
        auth_tokens=tokens_file, harnesses=[("tooler", tooler.address)], tool_executors=[STAMP]
    ) as host:
        uid = await create(host.http, bearer(ALICE), harness="tooler")
        _, lines = await exec_lines(
            host.http, f"{API}/sessions/{uid}/exec", {"inputs": [user_input("hi")]}, bearer(ALICE)
        )
        pending = [line["session"] for line in lines if "session" in line][-1]["pendingApproval"]
        body = {**pending, "approved": True}

        # Claiming to be someone else is refused, as on gRPC; bob may not approve at all.
        claimed = await host.http.post(
            f"{API}/sessions/{uid}/approve",
            json={**body, "identity": {"principal": "user:mallory"}},
            headers=bearer(ALICE),
        )
        assert refusal(claimed)[:2] == (403, "PERMISSION_DENIED")
        by_bob = await host.http.post(f"{API}/sessions/{uid}/approve", json=body, headers=bearer(BOB))
        assert (
            refusal(by_bob)[:2] == (403, "PERMISSION_DENIED")
            and "lacks role 'approver'" in refusal(by_bob)[2]
        )

        decided = await host.http.post(f"{API}/sessions/{uid}/approve", json=body, headers=bearer(ALICE))
        assert decided.status_code == 200, decided.text
        seq = int(decided.json()["decision"]["seq"])
        replay = session_pb2.ReplayRequest(session=uid, from_seq=seq, to_seq=seq)
        (record,) = [r async for r in host.sessions.Replay(replay, metadata=bearer_metadata(ALICE))]
        assert record.event.kind == common_pb2.EVENT_APPROVAL_RESULT
        assert (record.event.actor.principal, record.event.actor.issuer) == ("user:alice", "example-idp")


def test_a_non_loopback_http_listener_needs_credentials(tokens_file: str) -> None:
    try:
        HostConfig(http_listen="0.0.0.0:8080")
    except ConfigError as exc:
        assert "--http-listen '0.0.0.0:8080' is not a loopback address" in str(exc)
    else:
        raise AssertionError("an unauthenticated HTTP listener off loopback was accepted")
    assert HostConfig(http_listen="0.0.0.0:8080", auth_tokens=tokens_file).http_listen == "0.0.0.0:8080"
