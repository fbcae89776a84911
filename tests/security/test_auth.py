"""Authentication and authorization over real gRPC (``--auth-tokens``): bearer tokens and client
certificates become principals; roles per method; projects per session; the authenticated
principal journaled as the actor of approvals and the identity of created sessions."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agentsessions.client import SessionsClient, bearer_metadata, tls_credentials
from agentsessions.host.auth.principals import AuthFileError, Principal, load_principals
from agentsessions.host.config import ConfigError, HostConfig
from agentsessions.host.logs import TextFormatter
from agentsessions.sdk.server import HarnessServer, start_server
from agentsessions.sdk.tls import ClientTLS, open_channel
from agentsessions.v1 import common_pb2, harness_registry_pb2, harness_registry_pb2_grpc, session_pb2
from tests.approvals.harnesses import ToolHarness
from tests.security.conftest import PKI
from tests.support.outcome import call_outcome
from tests.support.processes import free_port
from tests.support.serving import serving

ALICE = "alice-token-0123456789"  # writer in default
BOB = "bob-token-0123456789ab"  # reader in other
CAROL = "carol-token-0123456789"  # approver everywhere
DAVE = "dave-token-0123456789a"  # writer in other
ROOT_TOKEN = "root-token-0123456789a"  # admin
HASHED = "hashed-token-0123456789"  # reader in default, written as its sha256

PRINCIPALS: dict[str, Any] = {
    "tokens": {
        ALICE: {
            "principal": "user:alice",
            "issuer": "example-idp",
            "subject": "alice@example.com",
            "projects": ["default"],
            "roles": ["writer"],
        },
        BOB: {"principal": "user:bob", "projects": ["other"], "roles": ["reader"]},
        CAROL: {"principal": "user:carol", "issuer": "example-idp", "projects": "*", "roles": ["approver"]},
        DAVE: {"principal": "user:dave", "projects": ["other"], "roles": ["writer"]},
        ROOT_TOKEN: {"principal": "ops:root", "projects": "*", "roles": ["admin"]},
        "sha256:" + hashlib.sha256(HASHED.encode()).hexdigest(): {
            "principal": "user:hashed",
            "projects": ["default"],
            "roles": ["reader"],
        },
    },
    "certificates": {
        "spiffe://example.org/ns/ci/sa/runner": {
            "principal": "svc:runner",
            "projects": ["default"],
            "roles": ["writer"],
        },
        "CN=console": {"principal": "svc:console", "projects": "*", "roles": ["reader"]},
    },
}


@pytest.fixture
def tokens_file(tmp_path: Path) -> str:
    path = tmp_path / "principals.json"
    path.write_text(json.dumps(PRINCIPALS))
    return str(path)


@pytest.fixture
async def tooler() -> AsyncIterator[HarnessServer]:
    """A harness whose turn parks on a REQUIRES_APPROVAL tool call."""
    running = await start_server(ToolHarness(), "127.0.0.1:0")
    yield running
    await running.stop(None)


@contextlib.asynccontextmanager
async def authenticated_host(
    tokens_file: str, tooler: HarnessServer | None = None, **options: Any
) -> AsyncIterator[Sequence[str]]:
    harnesses = [("tooler", tooler.address)] if tooler is not None else []
    config = HostConfig(
        listen="127.0.0.1:0", journal="memory:", auth_tokens=tokens_file, harnesses=harnesses, **options
    )
    async with serving(config) as addresses:
        yield addresses


def client(address: str, token: str | None) -> SessionsClient:
    return SessionsClient.connect(address, metadata=bearer_metadata(token) if token else ())


async def status_of(call: Any) -> tuple[grpc.StatusCode, str]:
    """How a call that must fail failed."""
    code, details = await call_outcome(call)
    assert code != grpc.StatusCode.OK, "the call succeeded"
    return code, details


async def drain(updates: AsyncIterator[session_pb2.ExecUpdate]) -> list[session_pb2.ExecUpdate]:
    return [u async for u in updates]


async def test_calls_without_a_known_principal_are_unauthenticated(tokens_file: str) -> None:
    async with authenticated_host(tokens_file) as (address,):
        async with client(address, None) as anonymous:
            code, details = await status_of(anonymous.create_session())
            assert code == grpc.StatusCode.UNAUTHENTICATED
            assert "authorization: Bearer <token>" in details
            assert (await status_of(anonymous.list_sessions()))[0] == grpc.StatusCode.UNAUTHENTICATED
        async with client(address, "not-a-known-token-at-all") as unknown:
            code, details = await status_of(unknown.get_session("sess-000000000000000000000000"))
            assert code == grpc.StatusCode.UNAUTHENTICATED
            assert "not-a-known-token" not in details
        malformed = SessionsClient.connect(address, metadata=(("authorization", f"Basic {ALICE}"),))
        async with malformed:
            code, details = await status_of(malformed.create_session())
            assert code == grpc.StatusCode.UNAUTHENTICATED
            assert details == "authorization metadata must be 'Bearer <token>'"


async def test_two_authorization_headers_are_unauthenticated(tokens_file: str) -> None:
    """Neither header wins: which one a proxy or a server would pick is a guess to refuse."""
    async with authenticated_host(tokens_file) as (address,):
        for first, second in ((ALICE, BOB), (BOB, ALICE), (ALICE, ALICE), ("not-known-token-xyz", ALICE)):
            doubled = (("authorization", f"Bearer {first}"), ("authorization", f"Bearer {second}"))
            async with SessionsClient.connect(address, metadata=doubled) as both:
                code, details = await status_of(both.create_session())
                assert code == grpc.StatusCode.UNAUTHENTICATED
                assert details == "more than one authorization header: send exactly one 'Bearer <token>'"
                assert (await status_of(both.list_sessions()))[0] == grpc.StatusCode.UNAUTHENTICATED
        async with client(address, ALICE) as alice:
            assert [s async for s in alice.list_sessions()] == [], "nothing was created"


async def test_health_and_reflection_stay_open(tokens_file: str) -> None:
    async with authenticated_host(tokens_file) as (address,), open_channel(address, None) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        stream = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(iter([request]))
        names = [s.name async for reply in stream for s in reply.list_services_response.service]
        assert "agentsessions.v1.Sessions" in names


async def test_each_method_needs_its_role(tokens_file: str) -> None:
    ref = common_pb2.ApprovalRef(execution_id="e", tool_call_id="t", request_seq=1)
    async with authenticated_host(tokens_file) as (address,):
        async with client(address, ALICE) as alice:
            created = await alice.create_session()
            uid = created.metadata.uid
            assert (await alice.get_session(uid)).metadata.uid == uid  # writer implies reader
            code, details = await status_of(alice.approve(ref, uid, approved=True))
            assert code == grpc.StatusCode.PERMISSION_DENIED
            needed = "lacks role 'approver', needed for agentsessions.v1.Sessions/Approve"
            assert details == f"principal 'user:alice' {needed}"
        async with client(address, HASHED) as reader:
            assert (await reader.get_session(uid)).metadata.uid == uid
            assert [r.seq async for r in reader.replay(uid)] == []
            for call in (
                reader.create_session(),
                reader.exec(uid, "hi"),
                reader.suspend(uid),
                reader.fork(uid),
            ):
                code, details = await status_of(call)
                assert code == grpc.StatusCode.PERMISSION_DENIED
                assert "lacks role 'writer'" in details
        async with client(address, CAROL) as carol:
            code, details = await status_of(carol.exec(uid, "hi"))
            assert (code, "lacks role 'writer'" in details) == (grpc.StatusCode.PERMISSION_DENIED, True)
            # Approve reaches the controller (the request names no pending approval).
            code, _ = await status_of(carol.approve(ref, uid, approved=True))
            assert code == grpc.StatusCode.FAILED_PRECONDITION


async def test_registry_needs_admin(tokens_file: str) -> None:
    registry_addr = f"127.0.0.1:{free_port()}"
    request = harness_registry_pb2.ListHarnessesRequest()
    async with (
        authenticated_host(tokens_file, registry_addr=registry_addr) as (_, registry),
        open_channel(registry, None) as channel,
    ):
        stub = harness_registry_pb2_grpc.HarnessRegistryStub(channel)
        code, details = await status_of(stub.ListHarnesses(request, metadata=bearer_metadata(ALICE)))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "lacks role 'admin'" in details
        listed = await stub.ListHarnesses(request, metadata=bearer_metadata(ROOT_TOKEN))
        assert "echo" in [h.metadata.name for h in listed.harnesses]


async def test_a_principal_acts_only_in_its_projects(tokens_file: str) -> None:
    async with authenticated_host(tokens_file) as (address,):
        async with client(address, ALICE) as alice:
            uid = (await alice.create_session()).metadata.uid
            await drain(alice.exec(uid, "hi"))
            code, details = await status_of(alice.create_session(project="other"))
            assert (code, details) == (
                grpc.StatusCode.PERMISSION_DENIED,
                "principal 'user:alice' may not use project 'other'",
            )
            assert (await status_of(alice.list_sessions(project="other")))[
                0
            ] == grpc.StatusCode.PERMISSION_DENIED
        unknown = "sess-000000000000000000000000"
        async with client(address, BOB) as bob:
            # A session in a project bob may not use answers exactly as an unknown one does:
            # neither its existence nor its project leaks.
            got, missing = await status_of(bob.get_session(uid)), await status_of(bob.get_session(unknown))
            assert got == (grpc.StatusCode.NOT_FOUND, f"session {uid!r} not found")
            assert missing == (grpc.StatusCode.NOT_FOUND, f"session {unknown!r} not found")
            assert [r async for r in bob.replay(uid)] == []
            # An unknown session has no records to show (as without authentication).
            assert [r async for r in bob.replay(unknown)] == []
            code, details = await status_of(bob.list_sessions())
            assert (code, details) == (
                grpc.StatusCode.PERMISSION_DENIED,
                "principal 'user:bob' may not use project 'default'",
            )
            assert [s async for s in bob.list_sessions(project="other")] == []
        async with client(address, DAVE) as dave:
            attempts: tuple[Any, ...] = (
                dave.exec(uid, "hi"),
                dave.suspend(uid),
                dave.resume(uid),
                dave.fork(uid),
                dave.cancel(uid),
                dave.delete_session(uid),
            )
            for attempt in attempts:
                code, details = await status_of(attempt)
                assert (code, details) == (grpc.StatusCode.NOT_FOUND, f"session {uid!r} not found")
            other = await dave.create_session(project="other")
            assert other.metadata.project == "other"
        async with client(address, ALICE) as alice:
            # Nothing dave tried reached the session.
            assert [r.seq async for r in alice.replay(uid)] == [1, 2, 3, 4, 5]


async def test_created_sessions_record_the_authenticated_identity(tokens_file: str) -> None:
    alice_identity = common_pb2.IdentityRef(
        principal="user:alice", issuer="example-idp", subject="alice@example.com"
    )
    async with authenticated_host(tokens_file) as (address,), client(address, ALICE) as alice:
        created = await alice.create_session()
        assert created.identity == alice_identity
        assert (await alice.get_session(created.metadata.uid)).identity == alice_identity
        claim = session_pb2.Session(identity=common_pb2.IdentityRef(principal="user:mallory"))
        code, details = await status_of(
            alice.stub.CreateSession(
                session_pb2.CreateSessionRequest(session=claim), metadata=bearer_metadata(ALICE)
            )
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "identity.principal 'user:mallory' is not the authenticated caller's ('user:alice')" in details
        # A claim that agrees with (part of) the authenticated identity is accepted.
        agreeing = session_pb2.Session(identity=common_pb2.IdentityRef(principal="user:alice"))
        stored = await alice.stub.CreateSession(
            session_pb2.CreateSessionRequest(session=agreeing), metadata=bearer_metadata(ALICE)
        )
        assert stored.identity == alice_identity
        # Exec without a session creates one for the caller, too.
        updates = await drain(alice.exec("", "hi"))
        assert updates[0].session.identity == alice_identity


async def test_approve_journals_the_authenticated_approver(tokens_file: str, tooler: HarnessServer) -> None:
    carol_identity = common_pb2.IdentityRef(principal="user:carol", issuer="example-idp")
    async with authenticated_host(tokens_file, tooler) as (address,):
        async with client(address, ALICE) as alice:
            uid = (await alice.create_session(harness="tooler")).metadata.uid
            updates = await drain(alice.exec(uid, "hi"))
            parked = updates[-1].session
            assert parked.exec_state == session_pb2.EXEC_AWAITING
            ref = parked.pending_approval
        async with client(address, CAROL) as carol:
            impostor = common_pb2.IdentityRef(principal="user:alice")
            code, details = await status_of(carol.approve(ref, uid, approved=True, identity=impostor))
            assert code == grpc.StatusCode.PERMISSION_DENIED
            assert "the actor is always the authenticated principal" in details
            decided = await carol.approve(ref, uid, approved=True, reason="looks fine")
            assert decided.decision.event.kind == common_pb2.EVENT_APPROVAL_RESULT
            assert decided.decision.event.actor == carol_identity
            # An exact retry by the same approver returns the same record.
            again = await carol.approve(ref, uid, approved=True, reason="looks fine", identity=carol_identity)
            assert again.decision == decided.decision
        async with client(address, ROOT_TOKEN) as root:
            # Another approver's identical decision is a different decision: refused, nothing written.
            code, details = await status_of(root.approve(ref, uid, approved=True, reason="looks fine"))
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert "by user:carol" in details
            journal = [r async for r in root.replay(uid)]
        results = [r for r in journal if r.event.kind == common_pb2.EVENT_APPROVAL_RESULT]
        assert [r.event.actor for r in results] == [carol_identity]


async def test_without_auth_tokens_identities_are_provenance_as_given() -> None:
    config = HostConfig(listen="127.0.0.1:0", journal="memory:")
    claimed = common_pb2.IdentityRef(principal="user:anyone", issuer="self-asserted")
    async with serving(config) as (address,), client(address, None) as anyone:
        request = session_pb2.CreateSessionRequest(session=session_pb2.Session(identity=claimed))
        created = await anyone.stub.CreateSession(request)
        assert created.identity == claimed
        assert (await anyone.create_session(project="any-project")).metadata.project == "any-project"


async def test_client_certificates_map_to_principals(tokens_file: str, pki: PKI) -> None:
    runner = pki.client("ci-runner", uri="spiffe://example.org/ns/ci/sa/runner")
    console = pki.client("console")
    nobody = pki.client("nobody", uri="spiffe://example.org/ns/ci/sa/other")
    config_options: dict[str, Any] = {
        "tls_cert": pki.server.cert,
        "tls_key": pki.server.key,
        "tls_client_ca": pki.ca.cert,
    }

    def as_cert(issued: Any, token: str | None = None) -> grpc.ChannelCredentials:
        return tls_credentials(ca_file=pki.ca.cert, cert_file=issued.cert, key_file=issued.key, token=token)

    async with authenticated_host(tokens_file, **config_options) as (address,):
        async with SessionsClient.connect(address, credentials=as_cert(runner)) as by_spiffe:
            created = await by_spiffe.create_session()
            assert created.identity.principal == "svc:runner"
        async with SessionsClient.connect(address, credentials=as_cert(console)) as by_cn:
            assert (await by_cn.get_session(created.metadata.uid)).metadata.uid == created.metadata.uid
            code, details = await status_of(by_cn.create_session())
            assert (code, "principal 'svc:console' lacks role 'writer'" in details) == (
                grpc.StatusCode.PERMISSION_DENIED,
                True,
            )
        async with SessionsClient.connect(address, credentials=as_cert(nobody)) as unmapped:
            code, details = await status_of(unmapped.list_sessions())
            assert (code, details) == (
                grpc.StatusCode.UNAUTHENTICATED,
                "the client certificate maps to no principal",
            )
        # A bearer token, when sent, decides who the caller is.
        async with SessionsClient.connect(address, credentials=as_cert(console, ALICE)) as with_token:
            assert (await with_token.create_session()).identity.principal == "user:alice"


async def test_tokens_never_reach_the_logs(tokens_file: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with authenticated_host(tokens_file) as (address,):
        async with client(address, ALICE) as alice:
            await alice.create_session()
        async with client(address, "wrong-token-4f6e2a9b1c") as wrong:
            await status_of(wrong.create_session())
    text = "\n".join(TextFormatter().format(record) for record in caplog.records)
    assert "UNAUTHENTICATED" in text and "CreateSession" in text
    assert ALICE not in text and "wrong-token-4f6e2a9b1c" not in text


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_token_file_in_toml(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "principals.toml",
        """
[tokens."toml-token-0123456789"]
principal = "user:erin"
subject = "erin"
projects = ["a", "b"]
roles = ["approver"]

[certificates."CN=robot"]
principal = "svc:robot"
projects = "*"
roles = ["admin"]
""",
    )
    principals = load_principals(path)
    erin = principals.by_token("toml-token-0123456789")
    assert erin == Principal("user:erin", "", "erin", frozenset({"a", "b"}), frozenset({"approver"}))
    assert erin.has_role("reader") and erin.has_role("approver") and not erin.has_role("writer")
    assert erin.may_use("a") and not erin.may_use("c")
    (robot,) = principals.by_certificate(["robot"], [])
    assert robot.may_use("anything") and robot.has_role("writer")
    assert principals.by_token("toml-token-012345678") is None


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            {"tokens": {"short": {"principal": "p", "projects": "*", "roles": ["reader"]}}},
            "at least 16 characters",
        ),
        (
            {"tokens": {"sha256:abc": {"principal": "p", "projects": "*", "roles": ["reader"]}}},
            "64 lowercase hex",
        ),
        (
            {"tokens": {ALICE: {"principal": "p", "projects": "*", "roles": ["owner"]}}},
            "unknown role(s) ['owner']",
        ),
        ({"tokens": {ALICE: {"principal": "p", "projects": [], "roles": ["reader"]}}}, "projects must be"),
        ({"tokens": {ALICE: {"principal": "", "projects": "*", "roles": ["reader"]}}}, "principal must be"),
        (
            {"tokens": {ALICE: {"principal": "host:policy", "projects": "*", "roles": ["approver"]}}},
            "are the host's own",
        ),
        (
            {"tokens": {ALICE: {"principal": "p", "projects": "*", "roles": ["reader"], "admin": True}}},
            "unknown key(s) ['admin']",
        ),
        ({"users": {}}, "unknown key(s) ['users']"),
        ({}, "names no tokens and no certificates"),
    ],
)
def test_token_file_rules(tmp_path: Path, document: Any, message: str) -> None:
    path = write(tmp_path, "principals.json", json.dumps(document))
    with pytest.raises(AuthFileError) as caught:
        load_principals(path)
    assert message in str(caught.value)
    assert ALICE not in str(caught.value)
    with pytest.raises(ConfigError, match=r"^--auth-tokens "):
        HostConfig(auth_tokens=path)


def test_token_file_must_exist_and_parse(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        HostConfig(auth_tokens=str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="is not valid JSON"):
        HostConfig(auth_tokens=write(tmp_path, "broken.json", "{"))


async def test_bearer_token_rides_tls_call_credentials(tokens_file: str, pki: PKI) -> None:
    options: dict[str, Any] = {"tls_cert": pki.server.cert, "tls_key": pki.server.key}
    async with authenticated_host(tokens_file, **options) as (address,):
        credentials = tls_credentials(ca_file=pki.ca.cert, token=ALICE)
        async with SessionsClient.connect(address, credentials=credentials) as alice:
            assert (await alice.create_session()).identity.principal == "user:alice"
        async with SessionsClient.connect(
            address, credentials=ClientTLS(pki.ca.cert).credentials()
        ) as nobody:
            assert (await status_of(nobody.create_session()))[0] == grpc.StatusCode.UNAUTHENTICATED


async def test_live_sessions_need_their_roles_and_projects(tokens_file: str) -> None:
    """Watch needs reader, Submit writer, both on the session's project; with authentication the
    queued and recovered turns run with the host's own authority."""
    async with authenticated_host(tokens_file) as (address,):
        async with client(address, ALICE) as alice:
            uid = (await alice.create_session(harness="echo")).metadata.uid
            submitted = await alice.submit(uid, "hi")
            seen = []
            async for update in alice.watch(uid):
                if update.HasField("record"):
                    seen.append(update.record)
                    if update.record.event.kind == common_pb2.EVENT_END:
                        break
            assert seen[0].event.execution_id == submitted.execution_id
        async with client(address, HASHED) as reader:
            assert [u.record.seq async for u in reader.watch(uid, follow=False) if u.HasField("record")] == [
                1,
                2,
                3,
                4,
                5,
            ]
            code, details = await status_of(reader.submit(uid, "no"))
            assert code == grpc.StatusCode.PERMISSION_DENIED
            assert "lacks role 'writer', needed for agentsessions.ext.v1.LiveSessions/Submit" in details
        async with client(address, BOB) as bob:  # a reader of another project: as if unknown
            unknown = "sess-000000000000000000000000"
            code, details = await status_of(bob.watch(uid, follow=False))
            missing = await status_of(bob.watch(unknown, follow=False))
            assert (code, details) == (grpc.StatusCode.NOT_FOUND, missing[1].replace(unknown, uid))
        async with client(address, None) as nobody:
            code, _ = await status_of(nobody.watch(uid, follow=False, reconnect=False))
            assert code == grpc.StatusCode.UNAUTHENTICATED


async def test_idempotency_keys_belong_to_their_principal(tokens_file: str) -> None:
    async with (
        authenticated_host(tokens_file) as (address,),
        client(address, ALICE) as alice,
        client(address, ROOT_TOKEN) as root,
    ):
        mine = await alice.create_session(harness="echo", idempotency_key="shared-name")
        theirs = await root.create_session(harness="echo", idempotency_key="shared-name")
        again = await alice.create_session(harness="echo", idempotency_key="shared-name")
    assert again.metadata.uid == mine.metadata.uid != theirs.metadata.uid
    assert mine.identity.principal == "user:alice" and theirs.identity.principal == "ops:root"
