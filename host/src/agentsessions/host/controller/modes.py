"""Host-enforced modes: what a session's mode lets a tool call the host runs do (docs/modes.md).

A session's mode is the strictest of its ``agentsessions.io/mode`` annotation (set by its creator,
or by the host from the project's policy when the session is created; this is the mode the harness
is told) and the mode its project's approval policy requires now. Before the host runs a call
(CONTROLLER_MEDIATED, or REQUIRES_APPROVAL at its gate and again after the decision) it judges the
call by the tool's classes, the union of what the host's tool configuration and the harness's
descriptor declare (a tool the host leaves unclassified counts as write):

==============  =========================  ==============================  =====================
mode            write (or unclassified)    subprocess                      read-only, network
==============  =========================  ==============================  =====================
plan            refused                    refused                         run
ask-before      needs approval             needs approval                  run
allow-edits     run                        needs approval                  run
auto            run                        run                             run
(none)          run                        run                             run
==============  =========================  ==============================  =====================

In every mode a subprocess the host cannot confine needs approval ("unconfinable subprocess"), and
so does a write or subprocess tool whose workspace lies outside its configured roots ("writes
outside the workspace"). A verdict is one of:

- **run**. A CONTROLLER_MEDIATED call runs. A REQUIRES_APPROVAL call is approved by the host (actor
  ``host:policy``, subject ``mode:<mode>``) only when the harness declares the tool's class in its
  descriptor and was told the session's mode: declaring the class hands the tool's requests to the
  mode. Otherwise the request waits for a person (or a rule, or a grant) as before: a mode never
  answers a request the harness meant for a person.
- **gate**. A REQUIRES_APPROVAL call's request carries the mode's reason and waits for a decision
  (rules and grants still apply). A CONTROLLER_MEDIATED call, which v1 cannot park, is refused with
  the reason and ``needs_approval: true``, saying to ask with REQUIRES_APPROVAL.
- **refuse**. The host denies the request itself (``mode:<mode>``), or answers the call with an
  error result; no rule or grant overrides it, and it holds after a decision too.

Every refusal is an ordinary v1 record the harness sees, with the reason.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agentsessions.host.controller.approval_policy import (
    MODE_SUBJECT,
    POLICY_PRINCIPAL,
    GateDecision,
    host_actor,
)
from agentsessions.host.journal.store import SessionRow
from agentsessions.host.tools.args import python_to_struct, struct_to_python
from agentsessions.host.tools.executor import error_result
from agentsessions.host.tools.profile import ToolProfile
from agentsessions.sdk.modes import (
    ALLOW_EDITS,
    ASK_BEFORE,
    MODE_ANNOTATION,
    MODES,
    PLAN,
    SUBPROCESS,
    TOOL_CLASSES,
    WRITE,
    declared_tool_classes,
    strictest,
)
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, harness_pb2

log = logging.getLogger(__name__)

RUN = "run"
GATE = "gate"
REFUSE = "refuse"

# Looks a host-run tool's profile up (None: no executor serves it).
Profiles = Callable[[str], Awaitable[ToolProfile | None]]


def session_mode(row: SessionRow) -> str:
    """The mode a session's annotation names ("" for none; a value that is no mode counts as
    plan, the strictest, so a damaged annotation never loosens anything)."""
    value = row.annotations.get(MODE_ANNOTATION, "")
    if value and value not in MODES:
        log.warning(
            "session %s: annotation %s=%r is not a mode; enforcing plan", row.uid, MODE_ANNOTATION, value
        )
        return PLAN
    return value


def harness_tool_classes(descriptor: harness_pb2.HarnessDescriptor | None) -> dict[str, frozenset[str]]:
    """The classes a descriptor's tool specs declare (``agentsessions.sdk.modes``), by tool."""
    if descriptor is None:
        return {}
    declared: dict[str, frozenset[str]] = {}
    for spec in descriptor.tools:
        classes = declared_tool_classes(spec.description)
        if classes is not None:
            declared[spec.name] = classes
    return declared


@struct(frozen=True)
class Verdict:
    """What the mode lets one call do."""

    action: str  # RUN, GATE or REFUSE
    mode: str = ""
    reason: str = ""
    classes: tuple[str, ...] = ()
    decides: bool = False  # the mode answers the tool's approval requests (see the module doc)

    def approval(self) -> GateDecision | None:
        """The host's approval of a request the mode answers, or None (a person decides)."""
        if self.action != RUN or not self.decides:
            return None
        return GateDecision(True, self.reason, host_actor(POLICY_PRINCIPAL, MODE_SUBJECT + self.mode))

    def denial(self) -> GateDecision | None:
        """The host's denial of a request the mode refuses, or None."""
        if self.action != REFUSE:
            return None
        return GateDecision(False, self.reason, host_actor(POLICY_PRINCIPAL, MODE_SUBJECT + self.mode))

    def refusal(
        self, call: common_pb2.ToolCall, *, approved: bool, by_mode: bool = False
    ) -> common_pb2.ToolResult | None:
        """The error result answering a call this verdict does not let run (None: it runs). A
        call approved by a person (or rule, or grant) passes a gate, the decision answered it; one
        the mode approved itself must still be one the mode runs; nothing passes a refusal."""
        if self.action == RUN or (self.action == GATE and approved and not by_mode):
            return None
        needs_approval = self.action == GATE
        message = f"refused by the host: {self.reason}"
        if needs_approval:
            message += "; ask for approval (REQUIRES_APPROVAL) to run it"
        detail: dict[str, Any] = {
            "mode": self.mode,
            "classes": list(self.classes),
            "reason": self.reason,
            "needs_approval": needs_approval,
        }
        refused = error_result(call, message)
        refused.output.CopyFrom(python_to_struct({"refused": detail}))
        return refused


def judge(
    tool: str,
    mode: str,
    profile: ToolProfile,
    declared: frozenset[str] = frozenset(),
    outside: str | None = None,
) -> Verdict:
    """The verdict for one call of ``tool``: ``profile`` is the host's configuration of it,
    ``declared`` the classes the harness declares, ``outside`` why its workspace lies outside its
    roots (see the module docstring's table)."""
    classes = profile.classes | declared
    if not profile.classes:
        # The host's configuration leaves the tool unclassified: it counts as write, and what the
        # harness declares can only add to that.
        known = f"; the harness declares {'/'.join(sorted(declared))}" if declared else ""
        what = f"{tool} is not classified by the host (counted as a write tool{known})"
        classes = classes | {WRITE}
    else:
        what = f"{tool} is a {'/'.join(sorted(classes))} tool"
    # A name that is no tool class counts as write: never looser than a known one.
    effective = {name if name in TOOL_CLASSES else WRITE for name in classes}
    shown = tuple(sorted(profile.classes | declared)) or ("unclassified",)
    subprocess = SUBPROCESS in effective
    changes = subprocess or WRITE in effective
    if mode == PLAN and changes:
        return Verdict(
            REFUSE, mode, f"plan mode: {what}, and no write or subprocess tool runs in plan mode", shown
        )
    gates = []
    if subprocess and (profile.confinement is None or not profile.confinement.confined):
        why = profile.confinement.detail if profile.confinement is not None else "the host does not start it"
        gates.append(f"unconfinable subprocess: {why}")
    if changes and outside is not None:
        gates.append(f"writes outside the workspace: {outside}")
    if mode == ASK_BEFORE and changes:
        gates.append(f"ask-before mode: {what}, which needs approval")
    elif mode == ALLOW_EDITS and subprocess:
        gates.append(f"allow-edits mode: {what}, which needs approval")
    if gates:
        return Verdict(GATE, mode, "; ".join(gates), shown)
    if subprocess:
        assert profile.confinement is not None
        ran = f"runs confined: {profile.confinement.detail}"
    else:
        ran = "runs without approval"
    return Verdict(RUN, mode, f"{mode or 'no'} mode: {what}, which {ran}", shown)


class ModeCheck:
    """The mode check of one execution's sink: the session's mode (enforced, and as the harness
    was told it), the harness's declared tool classes, and the host's tool profiles."""

    def __init__(
        self,
        mode: str,
        profiles: Profiles | None,
        harness_classes: Mapping[str, frozenset[str]] | None = None,
        *,
        announced: str = "",
    ) -> None:
        self.mode = mode
        self.announced = announced
        self._profiles = profiles
        self._harness = dict(harness_classes or {})

    @classmethod
    def for_session(
        cls,
        row: SessionRow,
        required: str,
        profiles: Profiles | None,
        descriptor: harness_pb2.HarnessDescriptor | None,
    ) -> ModeCheck:
        """The check for a session whose project's policy requires ``required`` ("" for none)."""
        announced = session_mode(row)
        return cls(
            strictest(announced, required),
            profiles,
            harness_tool_classes(descriptor),
            announced=announced,
        )

    async def verdict(self, call: common_pb2.ToolCall) -> Verdict | None:
        """The verdict on a call, or None when no executor serves its tool (the registry then
        refuses it as before: nothing is known to judge)."""
        if self._profiles is None:
            return None
        profile = await self._profiles(call.tool)
        if profile is None:
            return None
        outside = None
        if profile.workspace is not None:
            args = struct_to_python(call.args if call.HasField("args") else None)
            outside = await profile.workspace.outside(args)
        declared = self._harness.get(call.tool)
        verdict = judge(call.tool, self.mode, profile, declared or frozenset(), outside)
        # Only a harness that was told the mode and classified the tool handed its requests to it.
        decides = bool(self.announced) and declared is not None
        return dataclasses.replace(verdict, decides=decides) if decides else verdict


def decided_by_mode(decision: common_pb2.Event) -> bool:
    """Whether a recorded decision is one a session's mode made."""
    actor = decision.actor
    return actor.principal == POLICY_PRINCIPAL and actor.subject.startswith(MODE_SUBJECT)
