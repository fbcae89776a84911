"""Decisions the host makes itself at an approval gate: policy rules, session grants, expiry, and
the mode a project requires.

The reference host has no policy hook (spec 4.6: "no expiry, policy hook, timeout or
auto-decision"); this host adds four, all journaled as ordinary decision records
(``EVENT_APPROVAL_RESULT``) so replay, recovery and the receipt rules stay exactly as for a human
decision. A host decision's ``actor`` names the host, never a person:
``IdentityRef{principal: "host:policy" | "host:expiry", issuer: "agentsessions", subject: <why>}``.

1. **Policy rules** (``--approval-policy FILE``, JSON or TOML), per project: a tool-name glob, an
   optional set of argument patterns, and ``approve`` or ``deny``. When a REQUIRES_APPROVAL call
   reaches the gate, the first matching rule decides (the project's own rules, then the rules for
   every project); the host journals the request, then its decision naming the rule, and the
   execution continues without parking.
2. **Session grants**: an approver who decides with ``approved: true`` and a reason starting with
   ``allow-session:`` grants that tool for the rest of the session. The decision record is the
   grant (durable, replayed, visible in the journal); later requests for the same tool in the same
   session are approved by the host, citing the grant's seq. Grants copied into a fork child are
   not honoured there (a fork is a new session). Rules come first: an operator's deny rule beats a
   grant.
3. **Expiry** (``expire_after_s``): an undecided request older than that is denied by the host with
   the reason ``expired after N s``. It is checked whenever the host looks at the gate (GetSession,
   Resume, Exec, Approve), so it survives restarts and works across replicas without timers. The
   request's age comes from its ``ts``: with an expiry configured the host stamps the request
   record with the time it was made; a request recorded without one (before expiry was configured)
   ages from the first time this host process saw it.

4. **Modes** (``mode``: plan, ask-before, allow-edits or auto; docs/modes.md): the mode a project's
   sessions must run in at least. A new session's ``agentsessions.io/mode`` annotation records it
   (the stricter of the creator's and the project's); the execution sinks enforce it on every
   call the host runs (``agentsessions.host.controller.modes``), and a refusal at a gate is
   journaled as a host decision whose actor's subject is ``mode:<mode>``.

Policy file (every key optional; ``rules`` at the top level apply to every project)::

    expire_after_s = 900
    session_grants = true
    mode = "ask-before"

    [[rules]]
    name = "reads"
    tool = "read_*"
    decision = "approve"

    [projects.payments]
    expire_after_s = 120

    [[projects.payments.rules]]
    name = "no-rm"
    tool = "run_shell"
    args = { command = '\\brm\\b' }
    decision = "deny"
    reason = "deleting files needs a person"

``args`` maps a path into the call's arguments (dotted keys; a number indexes a list, so
``files.0.path``) to a regular expression searched in the value's text (strings as they are,
other values as compact JSON; anchor with ``^...$`` for a whole match). Every pattern must match,
and a missing path does not match.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import time
import tomllib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from agentsessions.host.controller.eventlog import last_of_kind
from agentsessions.sdk.modes import MODES
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

K = common_pb2.EventKind

HOST_ISSUER = "agentsessions"
POLICY_PRINCIPAL = "host:policy"
EXPIRY_PRINCIPAL = "host:expiry"
SESSION_GRANT_PREFIX = "allow-session:"
SESSION_GRANT_SUBJECT = "session-grant"
MODE_SUBJECT = "mode:"  # the subject of a decision the session's mode made (controller/modes.py)
ANY_PROJECT = "*"

_DECISIONS = {"approve": True, "deny": False}
_RULE_KEYS = {"name", "tool", "args", "decision", "reason"}
_SCOPE_KEYS = {"expire_after_s", "session_grants", "rules", "mode"}
_TOP_KEYS = _SCOPE_KEYS | {"projects"}


class ApprovalPolicyError(ValueError):
    """The policy file breaks a rule; the message names where."""


@struct(frozen=True)
class Rule:
    """One policy rule: which calls it matches and what it decides."""

    name: str
    tool: str
    approve: bool
    args: tuple[tuple[str, re.Pattern[str]], ...] = ()
    reason: str = ""

    def matches(self, call: common_pb2.ToolCall) -> bool:
        if not fnmatch.fnmatchcase(call.tool, self.tool):
            return False
        if not self.args:
            return True
        values = json_format.MessageToDict(call.args) if call.HasField("args") else {}
        for path, pattern in self.args:
            found, value = _lookup(values, path)
            if not found or pattern.search(_text_of(value)) is None:
                return False
        return True


@struct(frozen=True)
class ProjectPolicy:
    """The rules and settings of one scope (a project, or every project)."""

    rules: tuple[Rule, ...] = ()
    expire_after_s: float | None = None
    session_grants: bool | None = None  # None: as the enclosing scope says (default on)
    mode: str | None = None  # None: as the enclosing scope says (default: no mode)


@struct(frozen=True)
class GateDecision:
    """A decision the host makes: journaled as an APPROVAL_RESULT with the host as actor."""

    approved: bool
    reason: str
    actor: common_pb2.IdentityRef

    def event(self, execution_id: str, tool_call_id: str, request_seq: int) -> common_pb2.Event:
        event = common_pb2.Event(
            execution_id=execution_id,
            kind=K.EVENT_APPROVAL_RESULT,
            approval_result=common_pb2.ApprovalResult(
                tool_call_id=tool_call_id, approved=self.approved, reason=self.reason, request_seq=request_seq
            ),
            actor=self.actor,
        )
        event.ts.GetCurrentTime()
        return event


def host_actor(principal: str, subject: str) -> common_pb2.IdentityRef:
    return common_pb2.IdentityRef(principal=principal, issuer=HOST_ISSUER, subject=subject)


def is_session_grant(decision: common_pb2.ApprovalResult) -> bool:
    """Whether a decision grants its tool for the rest of the session."""
    return decision.approved and decision.reason.startswith(SESSION_GRANT_PREFIX)


class ApprovalPolicy:
    """The host's approval policy; the empty policy only honours session grants."""

    def __init__(
        self,
        default: ProjectPolicy | None = None,
        projects: Mapping[str, ProjectPolicy] | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.default = default or ProjectPolicy()
        self.projects = dict(projects or {})
        self._clock = clock
        # Tools whose requests only the host's own code decides (subagents: ``task``), never a rule or expiry.
        self.host_decided: frozenset[str] = frozenset()
        # (session, request seq) -> when this process first saw a request recorded without ts.
        self._first_seen: dict[tuple[str, int], float] = {}

    @classmethod
    def from_file(cls, path: str | Path) -> ApprovalPolicy:
        """Load a JSON or TOML (by the ``.toml`` suffix) policy file; raises ApprovalPolicyError."""
        where = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ApprovalPolicyError(f"approval policy {where}: {exc.strerror or exc}") from None
        try:
            document = tomllib.loads(text) if where.endswith(".toml") else json.loads(text)
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            raise ApprovalPolicyError(f"approval policy {where}: not valid {_format(where)}: {exc}") from None
        return cls.from_mapping(document, where=where)

    @classmethod
    def from_mapping(cls, document: object, *, where: str = "approval policy") -> ApprovalPolicy:
        if not isinstance(document, dict):
            raise ApprovalPolicyError(f"{where}: must be an object")
        _no_unknown(document, _TOP_KEYS, where)
        default = _scope(document, where, ANY_PROJECT)
        projects_doc = document.get("projects", {})
        if not isinstance(projects_doc, dict):
            raise ApprovalPolicyError(f"{where}: projects must be an object of project name -> settings")
        projects = {}
        for name, settings in projects_doc.items():
            at = f"{where}: projects.{name}"
            if not name or name == ANY_PROJECT:
                raise ApprovalPolicyError(f"{at}: a project name (top-level settings apply to every project)")
            if not isinstance(settings, dict):
                raise ApprovalPolicyError(f"{at}: must be an object")
            _no_unknown(settings, _SCOPE_KEYS, at)
            projects[name] = _scope(settings, at, name)
        return cls(default, projects)

    # -- what the gate asks ------------------------------------------------------------------

    def expiry_for(self, project: str) -> float | None:
        """Seconds an undecided request of ``project`` may wait, or None (no expiry)."""
        scoped = self.projects.get(project)
        if scoped is not None and scoped.expire_after_s is not None:
            return scoped.expire_after_s
        return self.default.expire_after_s

    def grants_for(self, project: str) -> bool:
        scoped = self.projects.get(project)
        if scoped is not None and scoped.session_grants is not None:
            return scoped.session_grants
        return self.default.session_grants is not False

    def mode_for(self, project: str) -> str:
        """The mode ``project``'s sessions must run in at least ("" for none)."""
        scoped = self.projects.get(project)
        if scoped is not None and scoped.mode is not None:
            return scoped.mode
        return self.default.mode or ""

    def rules_for(self, project: str) -> tuple[Rule, ...]:
        scoped = self.projects.get(project)
        return (scoped.rules if scoped is not None else ()) + self.default.rules

    def decide(
        self,
        project: str,
        call: common_pb2.ToolCall,
        events: Sequence[common_pb2.Event],
        fork_seq: int = 0,
    ) -> GateDecision | None:
        """A rule's or a session grant's decision for a call reaching the gate, or None (park)."""
        for rule in self.rules_for(project):
            if rule.matches(call):
                verb = "approved" if rule.approve else "denied"
                reason = f'policy rule "{rule.name}": {rule.reason or verb}'
                return GateDecision(rule.approve, reason, host_actor(POLICY_PRINCIPAL, rule.name))
        if self.grants_for(project):
            grant = session_grant(events, call.tool, fork_seq)
            if grant is not None:
                seq, actor = grant
                by = f" by {actor.principal}" if actor.principal else ""
                reason = f"session grant for {call.tool}: decision at seq {seq}{by}"
                return GateDecision(True, reason, host_actor(POLICY_PRINCIPAL, SESSION_GRANT_SUBJECT))
        return None

    def expired(
        self, project: str, session: str, request: common_pb2.Event, request_seq: int
    ) -> GateDecision | None:
        """The expiry denial for an undecided request that waited too long, or None."""
        limit = self.expiry_for(project)
        if limit is None:
            return None
        if request.HasField("ts"):
            made = request.ts.seconds + request.ts.nanos / 1e9
        else:
            made = self._first_seen.setdefault((session, request_seq), self._clock())
        if self._clock() - made < limit:
            return None
        return GateDecision(False, f"expired after {limit:g} s", host_actor(EXPIRY_PRINCIPAL, "expiry"))

    def settle(
        self,
        project: str,
        session: str,
        fork_seq: int,
        events: Sequence[common_pb2.Event],
        execution_id: str,
        tool_call_id: str,
        request_seq: int,
    ) -> common_pb2.Event | None:
        """The decision record the host journals for an undecided owned request, if any:
        a rule or grant first (as at the gate), then expiry."""
        # The first such call, looked for among the TOOL_CALLs alone (a cached journal decodes no
        # other record to find them).
        call = None
        for _, e in last_of_kind(events, K.EVENT_TOOL_CALL, len(events)):
            if e.execution_id == execution_id and e.tool.id == tool_call_id:
                call = e.tool
        if call is None or not 0 < request_seq <= len(events) or call.tool in self.host_decided:
            return None
        decision = self.decide(project, call, events, fork_seq)
        if decision is None:
            decision = self.expired(project, session, events[request_seq - 1], request_seq)
        if decision is None:
            return None
        self._first_seen.pop((session, request_seq), None)
        return decision.event(execution_id, tool_call_id, request_seq)


@struct
class SessionGate:
    """The policy as one session's execution sink consults it when a request is made."""

    policy: ApprovalPolicy
    session: str
    project: str
    fork_seq: int
    events: Callable[[], Awaitable[Sequence[common_pb2.Event]]] = field(repr=False)

    def stamp_request(self, request: common_pb2.Event) -> None:
        """Time-stamp a new request when its project has an expiry (its age is then durable)."""
        if self.policy.expiry_for(self.project) is not None:
            request.ts.GetCurrentTime()

    async def decide(
        self, call: common_pb2.ToolCall, execution_id: str, request_seq: int
    ) -> common_pb2.Event | None:
        """The host's decision record for a request just made, or None to park."""
        decision = self.policy.decide(self.project, call, await self.events(), self.fork_seq)
        if decision is None:
            return None
        return decision.event(execution_id, call.id, request_seq)


def session_grant(
    events: Sequence[common_pb2.Event], tool: str, fork_seq: int = 0
) -> tuple[int, common_pb2.IdentityRef] | None:
    """(seq, actor) of the first grant of ``tool`` recorded in this session (not a fork's prefix)."""
    tools: dict[tuple[str, str], str] = {}
    for index, event in enumerate(events):
        if event.kind == K.EVENT_TOOL_CALL:
            tools[(event.execution_id, event.tool.id)] = event.tool.tool
        elif event.kind == K.EVENT_APPROVAL_RESULT and index >= fork_seq:
            decision = event.approval_result
            if is_session_grant(decision) and tools.get((event.execution_id, decision.tool_call_id)) == tool:
                return index + 1, event.actor
    return None


def _format(where: str) -> str:
    return "TOML" if where.endswith(".toml") else "JSON"


def _no_unknown(document: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(document) - known)
    if unknown:
        raise ApprovalPolicyError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))} (known: {', '.join(sorted(known))})"
        )


def _scope(document: Mapping[str, Any], where: str, label: str) -> ProjectPolicy:
    expire = document.get("expire_after_s")
    if expire is not None and (
        isinstance(expire, bool)
        or not isinstance(expire, int | float)
        or not math.isfinite(expire)
        or expire <= 0
    ):
        raise ApprovalPolicyError(
            f"{where}: expire_after_s must be a positive number of seconds, got {expire!r}"
        )
    grants = document.get("session_grants")
    if grants is not None and not isinstance(grants, bool):
        raise ApprovalPolicyError(f"{where}: session_grants must be true or false, got {grants!r}")
    mode = document.get("mode")
    if mode is not None and mode not in MODES:
        raise ApprovalPolicyError(f"{where}: mode must be one of {', '.join(MODES)}, got {mode!r}")
    rules_doc = document.get("rules", [])
    if not isinstance(rules_doc, list):
        raise ApprovalPolicyError(f"{where}: rules must be a list")
    rules = tuple(_rule(item, f"{where}: rules[{i}]", f"{label}#{i + 1}") for i, item in enumerate(rules_doc))
    names = [r.name for r in rules]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ApprovalPolicyError(f"{where}: rule names repeat: {', '.join(repeated)}")
    return ProjectPolicy(rules, float(expire) if expire is not None else None, grants, mode)


def _rule(document: object, where: str, default_name: str) -> Rule:
    if not isinstance(document, dict):
        raise ApprovalPolicyError(f"{where}: must be an object")
    _no_unknown(document, _RULE_KEYS, where)
    for key in ("name", "tool", "decision", "reason"):
        if key in document and not isinstance(document[key], str):
            raise ApprovalPolicyError(f"{where}: {key} must be a string")
    tool = document.get("tool", "")
    if not tool:
        raise ApprovalPolicyError(f"{where}: tool is required (a tool name or glob such as 'read_*')")
    decision = document.get("decision")
    if decision not in _DECISIONS:
        raise ApprovalPolicyError(f"{where}: decision must be 'approve' or 'deny', got {decision!r}")
    args_doc = document.get("args", {})
    if not isinstance(args_doc, dict):
        raise ApprovalPolicyError(f"{where}: args must be an object of argument path -> regular expression")
    args = []
    for path, pattern in args_doc.items():
        if not path or not isinstance(pattern, str):
            raise ApprovalPolicyError(f"{where}: args.{path}: must map a path to a regular expression string")
        try:
            args.append((path, re.compile(pattern)))
        except re.error as exc:
            raise ApprovalPolicyError(f"{where}: args.{path}: bad regular expression: {exc}") from None
    name = document.get("name") or default_name
    if name.startswith(MODE_SUBJECT) or name == SESSION_GRANT_SUBJECT:
        raise ApprovalPolicyError(
            f"{where}: name {name!r} is the host's own (mode decisions and session grants use it)"
        )
    return Rule(
        name=name,
        tool=tool,
        approve=_DECISIONS[decision],
        args=tuple(args),
        reason=document.get("reason", ""),
    )


def _lookup(values: Any, path: str) -> tuple[bool, Any]:
    current = values
    for part in path.split("."):
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return False, None
    return True, current


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
