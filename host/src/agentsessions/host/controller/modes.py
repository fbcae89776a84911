"""Host-enforced modes: what a session's mode lets a tool call the host runs do (docs/modes.md).

A session's mode is the strictest of its ``agentsessions.io/mode`` annotation (set by its creator,
or by the host from the project's policy when the session is created) and the mode its project's
approval policy requires now. Before the host runs a call (CONTROLLER_MEDIATED, or
REQUIRES_APPROVAL at its gate and again after the decision) it judges the call by the tool's
classes, the union of what the host's tool configuration and the harness's descriptor declare (a
tool neither classifies counts as write):

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
outside the workspace"). A verdict is one of: run; gate (a REQUIRES_APPROVAL call's request carries
the reason and waits for a decision as usual; a CONTROLLER_MEDIATED call, which v1 cannot park, is
refused with the reason, saying to ask for approval); refuse (the host denies the request itself,
or answers the call with an error result). Every refusal is an ordinary v1 record the harness sees.
A mode only adds refusals and gates: it never approves a call the harness asked a person about.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentsessions.host.journal.store import SessionRow
from agentsessions.host.tools.args import python_to_struct, struct_to_python
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


@dataclass(frozen=True)
class Verdict:
    """What the mode lets one call do."""

    action: str  # RUN, GATE or REFUSE
    mode: str = ""
    reason: str = ""
    classes: tuple[str, ...] = ()

    def refusal(self, call: common_pb2.ToolCall, *, approved: bool) -> common_pb2.ToolResult | None:
        """The error result answering a call this verdict does not let run (None: it runs). An
        approved call passes a gate (the decision answered it); nothing passes a refusal."""
        if self.action == RUN or (self.action == GATE and approved):
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
        return common_pb2.ToolResult(
            id=call.id,
            is_error=True,
            code=common_pb2.ToolResult.EXECUTOR_ERROR,
            error=message,
            content=[common_pb2.Part(text=common_pb2.TextPart(text=message))],
            output=python_to_struct({"refused": detail}),
        )


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
    return Verdict(RUN, mode, "", shown)


class ModeCheck:
    """The mode check of one execution's sink: its session's mode, the harness's declared tool
    classes, and the host's tool profiles."""

    def __init__(
        self,
        mode: str,
        profiles: Profiles | None,
        harness_classes: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        self.mode = mode
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
        return cls(strictest(session_mode(row), required), profiles, harness_tool_classes(descriptor))

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
        verdict = judge(call.tool, self.mode, profile, self._harness.get(call.tool, frozenset()), outside)
        if verdict.action != RUN:
            log.info(
                "tool %s: %s by the host (%s)",
                call.tool,
                "gated" if verdict.action == GATE else "refused",
                verdict.reason,
            )
        return verdict
