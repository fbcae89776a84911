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

``agentsessions-history-base: TOKEN`` (empty: none), and the harness's ``agentsessions-history-held``
    History by reference. ``Start.history`` holds every earlier event of the session, so a long
    session's Start frames grow by about five events a turn (3.5 MB at turn 10,000). A harness
    process served by this SDK keeps the history of the sessions it served, and says so: its
    Connect stream's trailing metadata (the status, which follows its last event) carries
    ``agentsessions-history-held: TOKEN`` (the Start's execution id) when it now holds that Start's
    whole history. (Earlier versions of the SDK said it in the initial metadata, a write of its
    own ahead of the first event; the host reads either.) The host reads the answer when it sends
    the session's next Start, so a harness must end its side of the stream after its END (or its
    PARKED acknowledgement), as v1 asks; one left open is cut after a grace and gets the whole
    history again. The host then sends the next Start
    of the session with ``agentsessions-history-base: TOKEN`` and only the events after the ones
    it sent with that Start; the harness puts the held events in front. A harness that does not
    hold ``TOKEN`` (it restarted, evicted the session, or is another process behind the address)
    ends the stream at once, before running anything, with FAILED_PRECONDITION and trailing
    metadata ``agentsessions-history-held: ""``; the host sends that Start again with the whole
    history. The header with an empty value says the host can send by reference and the Start
    carries the whole history. The host sends a base only to the connection that answered
    ``held`` (a new connection starts over), so a v1 harness, which never answers it, always gets
    the whole history; harness processes behind one address must all run this SDK, or none.

Records with ``actor.principal == "host:results"`` (:data:`RESULTS_PRINCIPAL`)
    Structured results (the host's ``result_schema``): an INPUT so marked tells the harness what
    to answer (its last line is the JSON Schema); an OUTPUT so marked is the host's settled
    result (a data part), written after the harness's own answer, which is no effect of the
    harness and which ``Start.conversation()`` leaves out (the answer it settles is already there).

``EVENT_LIFECYCLE{LIFECYCLE_BASELINE, detail: <summary>}`` first in ``Start.history``
    A compacted session's history begins at its latest baseline: the summary of everything before
    it. ``Start.conversation()`` puts it first as a user message (``SUMMARY_PREFIX`` + summary) and
    drops whatever came before it. The summarizer's OUTPUT (``actor.principal`` "host:compaction",
    :data:`COMPACTION_PRINCIPAL`) is the host's record, never part of a conversation.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentsessions.sdk.modes import MODES
from agentsessions.sdk.structs import struct

RUN_MODE = "agentsessions-run"
RESULTS_PRINCIPAL = "host:results"
COMPACTION_PRINCIPAL = "host:compaction"
SUMMARY_PREFIX = "Summary of the conversation so far:\n"
RECORDED_EFFECTS = "agentsessions-recorded-effects"
FEATURES = "agentsessions-features"
APPROVAL_REASON = "approval-reason"
MODE = "agentsessions-mode"
HISTORY_BASE = "agentsessions-history-base"
HISTORY_HELD = "agentsessions-history-held"

LIVE = "live"
RECOVERY = "recovery"
REPLAY = "replay"
_MODES = frozenset({RECOVERY, REPLAY})


@struct(frozen=True)
class ConnectExtensions:
    """What the host announced on one Connect call."""

    run_mode: str = LIVE
    recorded_effects: int = 0
    approval_reason: bool = False
    mode: str = ""  # the session's mode ("" when it has none)
    # None: the host sends no history by reference; "": it can, this Start has the whole history.
    history_base: str | None = None


NONE = ConnectExtensions()


def connect_metadata(
    run_mode: str, recorded_effects: int, history_base: str | None = None, *, mode: str = ""
) -> list[tuple[str, str]]:
    """The metadata the host sends on a Connect call for a run of this kind (``history_base``: see
    the module docstring, None leaves the header out; ``mode``: the session's mode, if it has one)."""
    metadata = [(FEATURES, APPROVAL_REASON)]
    if run_mode in _MODES:
        metadata.append((RUN_MODE, run_mode))
        metadata.append((RECORDED_EFFECTS, str(recorded_effects)))
    if mode:
        metadata.append((MODE, mode))
    if history_base is not None:
        metadata.append((HISTORY_BASE, history_base))
    return metadata


def parse_connect_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> ConnectExtensions:
    """The extensions a Connect call's metadata announces (malformed values announce nothing)."""
    if not metadata:
        return NONE
    mode = LIVE
    recorded = 0
    reason = False
    session_mode = ""
    base: str | None = None
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
        elif key == HISTORY_BASE:
            base = value
    if mode == LIVE:
        recorded = 0
    if (mode, recorded, reason, session_mode, base) == (LIVE, 0, False, "", None):
        return NONE
    return ConnectExtensions(
        run_mode=mode,
        recorded_effects=recorded,
        approval_reason=reason,
        mode=session_mode,
        history_base=base,
    )
