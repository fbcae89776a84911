"""Approval policies beyond the reference: rules per project, session grants and expiry.

The policy file's rules, the ``allow-session:`` convention and expiry, first on their own and then
over the real wire with ToolHarness in its own process: a host decision is journaled as an
APPROVAL_RESULT whose actor is the host, and the turn goes on exactly as after a person's.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from agentsessions.host.controller.approval_policy import (
    EXPIRY_PRINCIPAL,
    HOST_ISSUER,
    POLICY_PRINCIPAL,
    ApprovalPolicy,
    ApprovalPolicyError,
    session_grant,
)
from agentsessions.host.journal import open_store
from agentsessions.host.journal.store import JournalStore
from agentsessions.sdk.approval import DENIED_MESSAGE
from agentsessions.v1 import common_pb2, session_pb2
from tests.approvals.calls import (
    StampTool,
    approve,
    config,
    get,
    journal,
    kinds,
    new_session,
    receipts_seen,
    records,
    resume,
    say,
)
from tests.support.host import HostUnderTest, running_host
from tests.support.processes import HarnessProcess

K = common_pb2.EventKind
APPROVAL = common_pb2.MEDIATION_REQUIRES_APPROVAL


def call(tool: str, **args: Any) -> common_pb2.ToolCall:
    struct = struct_pb2.Struct()
    struct.update(args)
    return common_pb2.ToolCall(id="c", tool=tool, args=struct, mediation=APPROVAL, idempotency_key="k")


POLICY_TOML = """
expire_after_s = 900

[[rules]]
name = "reads"
tool = "read_*"
decision = "approve"

[projects.payments]
expire_after_s = 30
session_grants = false

[[projects.payments.rules]]
name = "no-rm"
tool = "run_shell"
args = { command = '\\brm\\b' }
decision = "deny"
reason = "deleting files needs a person"

[[projects.payments.rules]]
tool = "write_file"
args = { path = "^docs/", "options.mode" = "^safe$", "files.1" = "b" }
decision = "approve"
"""


def test_a_toml_policy_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY_TOML, encoding="utf-8")
    policy = ApprovalPolicy.from_file(path)
    assert policy.expiry_for("payments") == 30 and policy.expiry_for("default") == 900
    assert policy.grants_for("default") and not policy.grants_for("payments")
    assert [r.name for r in policy.rules_for("payments")] == ["no-rm", "payments#2", "reads"]
    assert [r.name for r in policy.rules_for("default")] == ["reads"]

    deny = policy.decide("payments", call("run_shell", command="rm -rf build"), [])
    assert deny is not None and not deny.approved
    assert deny.reason == 'policy rule "no-rm": deleting files needs a person'
    assert deny.actor == common_pb2.IdentityRef(
        principal=POLICY_PRINCIPAL, issuer=HOST_ISSUER, subject="no-rm"
    )
    assert policy.decide("payments", call("run_shell", command="grep -r form ."), []) is None
    assert policy.decide("default", call("run_shell", command="rm x"), []) is None, "the rule is per project"

    good = call("write_file", path="docs/a.md", options={"mode": "safe"}, files=["a", "b"])
    approved = policy.decide("payments", good, [])
    assert (
        approved is not None and approved.approved and approved.reason == 'policy rule "payments#2": approved'
    )
    for bad in [
        call("write_file", path="src/a.py", options={"mode": "safe"}, files=["a", "b"]),
        call("write_file", path="docs/a.md", options={"mode": "unsafe"}, files=["a", "b"]),
        call("write_file", path="docs/a.md", options={"mode": "safe"}, files=["a"]),
        call("write_file", path="docs/a.md", files=["a", "b"]),
    ]:
        assert policy.decide("payments", bad, []) is None, bad.args
    read = policy.decide("payments", call("read_file", path="x"), [])
    assert read is not None and read.approved and "reads" in read.reason


def test_a_json_policy_file_loads_and_values_match_as_text(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    document = {
        "rules": [
            {"tool": "scale", "args": {"replicas": "^[1-3]$", "force": "^false$"}, "decision": "approve"}
        ]
    }
    path.write_text(json.dumps(document), encoding="utf-8")
    policy = ApprovalPolicy.from_file(path)
    assert policy.expiry_for("any") is None
    assert policy.decide("p", call("scale", replicas=2, force=False), []) is not None
    assert policy.decide("p", call("scale", replicas=5, force=False), []) is None
    assert policy.decide("p", call("scale", replicas=2, force=True), []) is None


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ({"rulez": []}, "unknown key(s) 'rulez'"),
        ({"rules": {}}, "rules must be a list"),
        ({"rules": [{"decision": "approve"}]}, "rules[0]: tool is required"),
        ({"rules": [{"tool": "x", "decision": "maybe"}]}, "rules[0]: decision must be 'approve' or 'deny'"),
        ({"rules": [{"tool": "x", "decision": "deny", "args": {"a": "("}}]}, "rules[0]: args.a: bad regular"),
        ({"rules": [{"tool": "x", "decision": "deny", "args": {"a": 3}}]}, "rules[0]: args.a"),
        ({"rules": [{"tool": "x", "decision": "deny", "when": 1}]}, "rules[0]: unknown key(s) 'when'"),
        ({"expire_after_s": 0}, "expire_after_s must be a positive number"),
        ({"expire_after_s": "soon"}, "expire_after_s must be a positive number"),
        ({"session_grants": "yes"}, "session_grants must be true or false"),
        ({"projects": {"*": {}}}, "projects.*"),
        (
            {"projects": {"p": {"rules": [{"tool": "x", "decision": "deny", "reason": 5}]}}},
            "projects.p: rules[0]",
        ),
        (
            {
                "rules": [
                    {"name": "a", "tool": "x", "decision": "deny"},
                    {"name": "a", "tool": "y", "decision": "deny"},
                ]
            },
            "rule names repeat: a",
        ),
        ([], "must be an object"),
    ],
)
def test_bad_policies_name_where(document: object, named: str) -> None:
    with pytest.raises(ApprovalPolicyError) as err:
        ApprovalPolicy.from_mapping(document, where="policy.json")
    assert str(err.value).startswith("policy.json")
    assert named in str(err.value)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ApprovalPolicyError, match=r"missing\.toml"):
        ApprovalPolicy.from_file(tmp_path / "missing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("rules = [", encoding="utf-8")
    with pytest.raises(ApprovalPolicyError, match="not valid TOML"):
        ApprovalPolicy.from_file(broken)


def decision_events(
    tool: str, reason: str, approved: bool = True, call_id: str = "c1"
) -> list[common_pb2.Event]:
    return [
        common_pb2.Event(
            execution_id="e1", kind=K.EVENT_TOOL_CALL, tool=common_pb2.ToolCall(id=call_id, tool=tool)
        ),
        common_pb2.Event(
            execution_id="e1",
            kind=K.EVENT_APPROVAL_REQUEST,
            approval=common_pb2.ApprovalRequest(tool_call_id=call_id),
        ),
        common_pb2.Event(
            execution_id="e1",
            kind=K.EVENT_APPROVAL_RESULT,
            approval_result=common_pb2.ApprovalResult(
                tool_call_id=call_id, approved=approved, reason=reason, request_seq=2
            ),
            actor=common_pb2.IdentityRef(principal="alice"),
        ),
    ]


def test_session_grants() -> None:
    policy = ApprovalPolicy()
    granted = decision_events("stamp", "allow-session: fine for today")
    assert session_grant(granted, "stamp") is not None
    decided = policy.decide("p", call("stamp"), granted)
    assert decided is not None and decided.approved
    assert decided.reason == "session grant for stamp: decision at seq 3 by alice"
    assert decided.actor.principal == POLICY_PRINCIPAL and decided.actor.subject == "session-grant"
    assert policy.decide("p", call("seal"), granted) is None, "a grant covers its own tool only"
    assert policy.decide("p", call("stamp"), decision_events("stamp", "fine for today")) is None
    assert (
        policy.decide("p", call("stamp"), decision_events("stamp", "allow-session: no", approved=False))
        is None
    )
    assert policy.decide("p", call("stamp"), granted, fork_seq=3) is None, (
        "a fork's copied grant is not honoured"
    )
    no_grants = ApprovalPolicy.from_mapping({"session_grants": False})
    assert no_grants.decide("p", call("stamp"), granted) is None
    deny_first = ApprovalPolicy.from_mapping({"rules": [{"tool": "stamp", "decision": "deny"}]})
    ruled = deny_first.decide("p", call("stamp"), granted)
    assert ruled is not None and not ruled.approved, "an operator's rule beats a grant"


def test_expiry_ages_from_the_request_time_or_from_first_sight() -> None:
    now = [1_000_000.0]
    policy = ApprovalPolicy.from_mapping({"expire_after_s": 60})
    policy._clock = lambda: now[0]
    stamped = common_pb2.Event(kind=K.EVENT_APPROVAL_REQUEST)
    stamped.ts.FromSeconds(int(now[0]) - 59)
    assert policy.expired("p", "s", stamped, 4) is None
    now[0] += 1
    denial = policy.expired("p", "s", stamped, 4)
    assert denial is not None and not denial.approved and denial.reason == "expired after 60 s"
    assert denial.actor == common_pb2.IdentityRef(
        principal=EXPIRY_PRINCIPAL, issuer=HOST_ISSUER, subject="expiry"
    )
    unstamped = common_pb2.Event(kind=K.EVENT_APPROVAL_REQUEST)
    assert policy.expired("p", "s", unstamped, 5) is None  # first seen now
    now[0] += 59
    assert policy.expired("p", "s", unstamped, 5) is None
    now[0] += 1
    assert policy.expired("p", "s", unstamped, 5) is not None
    assert ApprovalPolicy().expired("p", "s", stamped, 4) is None, "no expiry configured"


# -- over the wire -----------------------------------------------------------------------------


class Clock:
    """Wall time plus a skew the test moves forward (expiry compares against journaled ts)."""

    def __init__(self) -> None:
        self.skew = 0.0

    def __call__(self) -> float:
        return time.time() + self.skew


@contextlib.asynccontextmanager
async def policy_host(
    store: JournalStore,
    tooler: HarnessProcess,
    stamp: StampTool,
    document: dict[str, Any],
    clock: Clock | None = None,
) -> AsyncIterator[HostUnderTest]:
    policy = ApprovalPolicy.from_mapping(document)
    if clock is not None:
        policy._clock = clock
    async with running_host(
        store, remote={"tooler": tooler.address}, tools=stamp.registry(), approval_policy=policy
    ) as host:
        yield host


def host_decision(rec: common_pb2.LogRecord, principal: str) -> common_pb2.ApprovalResult:
    assert rec.event.kind == K.EVENT_APPROVAL_RESULT
    assert rec.event.actor.principal == principal and rec.event.actor.issuer == HOST_ISSUER
    assert rec.event.ts.seconds > 0
    return rec.event.approval_result


async def test_a_rule_approves_at_the_gate_without_parking(
    store: JournalStore, tooler_process: HarnessProcess
) -> None:
    stamp = StampTool(store)
    rules = {"projects": {"ops": {"rules": [{"name": "stamps-ok", "tool": "st*", "decision": "approve"}]}}}
    async with policy_host(store, tooler_process, stamp, rules) as host:
        uid = await new_session(host, "tooler", metadata=common_pb2.ResourceMetadata(project="ops"))
        updates = await host.exec(say(uid, "hi"))
        recs = records(updates)
        assert kinds(recs) == [
            "EXECUTION_START",
            "INPUT",
            "MODEL_CALL",
            "OUTPUT",
            "TOOL_CALL",
            "APPROVAL_REQUEST",
            "APPROVAL_RESULT",
            "TOOL_RESULT",
            "OUTPUT",
            "END",
        ]
        assert updates[-1].WhichOneof("update") == "record", "no park, no final Session frame"
        decision = host_decision(recs[6], POLICY_PRINCIPAL)
        assert recs[6].event.actor.subject == "stamps-ok"
        assert decision == common_pb2.ApprovalResult(
            tool_call_id="call-0", approved=True, reason='policy rule "stamps-ok": approved', request_seq=6
        )
        receipt = recs[7].event.result
        assert (receipt.approval_request_seq, receipt.approval_decision_seq) == (
            6,
            7,
        ) and not receipt.is_error
        (seen,) = receipts_seen(recs)
        assert seen["output"] == {"stamped": "echo:hi"} and seen["approval_decision_seq"] == 7
        assert len(stamp.runs) == 1
        assert not recs[5].event.HasField("ts"), "no expiry configured: the request is not time-stamped"
        report = await host.controller.replay(uid)
        assert report.model_calls == 0 and len(stamp.runs) == 1

        other = await new_session(host, "tooler")  # project "default": no rule applies
        parked = await host.exec(say(other, "hi"))
        assert parked[-1].session.exec_state == session_pb2.EXEC_AWAITING


async def test_a_deny_rule_on_an_argument_pattern(
    store: JournalStore, tooler_process: HarnessProcess
) -> None:
    stamp = StampTool(store)
    rules = {"rules": [{"name": "no-rm", "tool": "stamp", "args": {"text": r"\brm\b"}, "decision": "deny"}]}
    async with policy_host(store, tooler_process, stamp, rules) as host:
        uid = await new_session(host, "tooler")
        recs = records(await host.exec(say(uid, "please rm it")))
        assert kinds(recs)[5:] == ["APPROVAL_REQUEST", "APPROVAL_RESULT", "TOOL_RESULT", "OUTPUT", "END"]
        decision = host_decision(recs[6], POLICY_PRINCIPAL)
        assert not decision.approved and decision.reason == 'policy rule "no-rm": denied'
        receipt = recs[7].event.result
        assert receipt.code == common_pb2.ToolResult.APPROVAL_DENIED and receipt.error == DENIED_MESSAGE
        assert stamp.runs == []
        parked = await host.exec(say(uid, "harmless"))
        assert parked[-1].session.exec_state == session_pb2.EXEC_AWAITING, "no rule matches: a person decides"


async def test_allow_session_grants_the_tool_for_the_rest_of_the_session(
    store: JournalStore, tooler_process: HarnessProcess
) -> None:
    stamp = StampTool(store)
    async with policy_host(store, tooler_process, stamp, {}) as host:
        uid = await new_session(host, "tooler")
        ref = (await host.exec(say(uid, "one")))[-1].session.pending_approval
        alice = common_pb2.IdentityRef(principal="alice")
        grant = (
            await approve(host, ref, True, "allow-session: stamping is fine", alice, session=uid)
        ).decision
        assert (await resume(host, uid)).exec_state == session_pb2.EXEC_COMPLETED

        recs = records(await host.exec(say(uid, "two")))
        assert "LIFECYCLE" not in kinds(recs), "granted: no park"
        result = next(r for r in recs if r.event.kind == K.EVENT_APPROVAL_RESULT)
        decision = host_decision(result, POLICY_PRINCIPAL)
        assert decision.approved
        assert decision.reason == f"session grant for stamp: decision at seq {grant.seq} by alice"
        assert len(stamp.runs) == 2

        seal = await host.exec(say(uid, "three", config=config(calls=[{"tool": "seal"}])))
        assert seal[-1].session.pending_approval.tool_call_id == "call-0", "another tool still asks a person"
        await approve(host, seal[-1].session.pending_approval, False, session=uid)
        await resume(host, uid)

        (child,) = (await host.sessions.Fork(session_pb2.ForkRequest(session=uid))).children
        in_child = await host.exec(say(child.metadata.uid, "four"))
        assert in_child[-1].session.exec_state == session_pb2.EXEC_AWAITING, "a fork does not inherit grants"

        report = await host.controller.replay(uid)
        assert report.model_calls == 0 and len(stamp.runs) == 2


async def test_an_undecided_request_expires_when_the_host_looks(
    store: JournalStore, tooler_process: HarnessProcess, journal_path: str
) -> None:
    stamp = StampTool(store)
    clock = Clock()
    async with policy_host(store, tooler_process, stamp, {"expire_after_s": 60}, clock) as host:
        uid = await new_session(host, "tooler")
        recs = records(await host.exec(say(uid, "hi")))
        request = recs[5]
        assert request.event.kind == K.EVENT_APPROVAL_REQUEST and request.event.ts.seconds > 0
        assert (await get(host, uid)).exec_state == session_pb2.EXEC_AWAITING
        assert (await store.head(uid)).seq == 7, "not expired yet: looking changes nothing"
    clock.skew = 61.0

    # A new host over the same journal: the request's age comes from the journal itself.
    second = await open_store(journal_path)
    try:
        async with policy_host(second, tooler_process, stamp, {"expire_after_s": 60}, clock) as host:
            got = await get(host, uid)
            assert got.exec_state == session_pb2.EXEC_AWAITING, "denied, the receipt still to come"
            tail = (await journal(second, uid))[7:]
            assert kinds(tail) == ["APPROVAL_RESULT"]
            decision = host_decision(tail[0], EXPIRY_PRINCIPAL)
            assert decision == common_pb2.ApprovalResult(
                tool_call_id="call-0", approved=False, reason="expired after 60 s", request_seq=request.seq
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await approve(host, got.pending_approval, True, session=uid)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "host:expiry" in (err.value.details() or "")
            resumed = await resume(host, uid)
            assert resumed.exec_state == session_pb2.EXEC_COMPLETED
            (seen,) = receipts_seen(await journal(second, uid))
            assert seen["code"] == "APPROVAL_DENIED" and seen["approval_decision_seq"] == 8
            assert stamp.runs == []
    finally:
        await second.close()


@pytest.mark.parametrize("via", ["approve", "resume", "exec"])
async def test_expiry_applies_on_every_path_to_the_gate(
    store: JournalStore, tooler_process: HarnessProcess, via: str
) -> None:
    stamp = StampTool(store)
    clock = Clock()
    async with policy_host(store, tooler_process, stamp, {"expire_after_s": 5}, clock) as host:
        uid = await new_session(host, "tooler")
        ref = (await host.exec(say(uid, "hi")))[-1].session.pending_approval
        clock.skew = 5.0
        if via == "approve":
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await approve(host, ref, True, session=uid)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "expired after 5 s" in (err.value.details() or "")
            assert kinds(await journal(store, uid))[-1] == "APPROVAL_RESULT"
            await resume(host, uid)
        elif via == "resume":
            assert (await resume(host, uid)).exec_state == session_pb2.EXEC_COMPLETED
        else:
            recs = records(await host.exec(session_pb2.ExecRequest(session=uid)))
            assert kinds(recs) == ["APPROVAL_RESULT", "TOOL_RESULT", "OUTPUT", "END"]
        recs = await journal(store, uid)
        denial = next(r for r in recs if r.event.kind == K.EVENT_APPROVAL_RESULT)
        assert host_decision(denial, EXPIRY_PRINCIPAL).reason == "expired after 5 s"
        assert kinds(recs).count("APPROVAL_RESULT") == 1
        assert recs[-1].event.kind in (K.EVENT_END, K.EVENT_LIFECYCLE)
        assert stamp.runs == []


async def test_a_rule_decides_a_request_parked_before_the_policy_existed(
    store: JournalStore, tooler_process: HarnessProcess
) -> None:
    stamp = StampTool(store)
    async with policy_host(store, tooler_process, stamp, {}) as host:
        uid = await new_session(host, "tooler")
        await host.exec(say(uid, "hi"))
    rules = {"rules": [{"name": "late", "tool": "stamp", "decision": "approve"}]}
    async with policy_host(store, tooler_process, stamp, rules) as host:
        resumed = await resume(host, uid)
        assert resumed.exec_state == session_pb2.EXEC_COMPLETED
        recs = await journal(store, uid)
        assert kinds(recs)[7:] == ["APPROVAL_RESULT", "TOOL_RESULT", "OUTPUT", "END", "LIFECYCLE"]
        assert host_decision(recs[7], POLICY_PRINCIPAL).reason == 'policy rule "late": approved'
        assert len(stamp.runs) == 1
