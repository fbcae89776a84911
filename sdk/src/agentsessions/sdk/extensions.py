"""What this host and SDK say on ``Harness.Connect`` beyond agentsessions.v1, and how.

No v1 message changes. The host announces everything in the call's request metadata, and the
harness side uses an extension only when the host announced it, so a v1 host (which announces
nothing) sees plain v1 from this SDK, and a v1 harness (which reads no metadata) sees plain v1
from this host.

``agentsessions-run: replay | recovery`` (absent: a live turn) and
``agentsessions-recorded-effects: N``
    The host is re-running an execution whose journal already holds N effects (model calls,
    direct outputs, tool calls, reports: what the sink's calls consume, in order). While the
    harness's own effects are within those N, it may ask for the *recorded* result of an
    IN_HARNESS_REPORTED tool call instead of running the tool again: it sends
    ``Event{EVENT_TOOL_CALL, tool: ToolCall{id, tool, args, mediation: IN_HARNESS_REPORTED}}``
    and the host answers ``ControllerFrame{tool: <the recorded ToolResult>}``, consuming that
    report exactly as a re-sent ``EVENT_TOOL_RESULT`` would (the ids must match, or the replay
    diverged). So a side-effecting in-harness tool runs once, live, and never again on
    ``agentsessions replay`` or on Resume. Past the N recorded effects the harness runs the tool
    and reports it as usual.

``agentsessions-features: approval-reason``
    The host takes a reason for an approval request: just before a REQUIRES_APPROVAL
    ``EVENT_TOOL_CALL`` the harness may send ``Event{EVENT_APPROVAL_REQUEST, approval:
    ApprovalRequest{tool_call_id, reason}}`` (no reply); the host journals that reason in the
    APPROVAL_REQUEST record it writes for the call. (The decision's reason needs no extension:
    v1's ``ControllerFrame.approval`` carries it.)

``agentsessions-mode: plan | ask-before | allow-edits | auto`` (absent: the session has no mode)
    The session's mode (``agentsessions.sdk.modes``), the same on every run of an execution (live,
    recovery, replay), so a harness that follows it re-runs identically. Whatever the harness
    does, the host enforces a mode at least this strict on every call it runs; a harness follows
    it for the tools it runs itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agentsessions.sdk.modes import MODES

RUN_MODE = "agentsessions-run"
RECORDED_EFFECTS = "agentsessions-recorded-effects"
FEATURES = "agentsessions-features"
APPROVAL_REASON = "approval-reason"
MODE = "agentsessions-mode"

LIVE = "live"
RECOVERY = "recovery"
REPLAY = "replay"
_MODES = frozenset({RECOVERY, REPLAY})


@dataclass(frozen=True)
class ConnectExtensions:
    """What the host announced on one Connect call."""

    run_mode: str = LIVE
    recorded_effects: int = 0
    approval_reason: bool = False
    mode: str = ""  # the session's mode ("" when it has none)


NONE = ConnectExtensions()


def connect_metadata(run_mode: str, recorded_effects: int, mode: str = "") -> list[tuple[str, str]]:
    """The metadata the host sends on a Connect call for a run of this kind (``mode``: the
    session's mode, if it has one)."""
    metadata = [(FEATURES, APPROVAL_REASON)]
    if run_mode in _MODES:
        metadata.append((RUN_MODE, run_mode))
        metadata.append((RECORDED_EFFECTS, str(recorded_effects)))
    if mode:
        metadata.append((MODE, mode))
    return metadata


def parse_connect_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> ConnectExtensions:
    """The extensions a Connect call's metadata announces (malformed values announce nothing)."""
    if not metadata:
        return NONE
    mode = LIVE
    recorded = 0
    reason = False
    session_mode = ""
    for key, value in metadata:
        if not isinstance(value, str):
            continue
        if key == RUN_MODE and value in _MODES:
            mode = value
        elif key == RECORDED_EFFECTS and value.isdigit():
            recorded = int(value)
        elif key == FEATURES:
            reason = APPROVAL_REASON in (v.strip() for v in value.split(","))
        elif key == MODE and value in MODES:
            session_mode = value
    if mode == LIVE:
        recorded = 0
    if (mode, recorded, reason, session_mode) == (LIVE, 0, False, ""):
        return NONE
    return ConnectExtensions(
        run_mode=mode, recorded_effects=recorded, approval_reason=reason, mode=session_mode
    )
