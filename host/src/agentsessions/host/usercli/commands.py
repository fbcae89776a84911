"""The client commands: one ``async`` function per command over a :class:`Call`.

Each command builds its request, calls the host (unary calls under ``--timeout``), prints the
result for a person or as proto3 JSON (``--json``), and returns an exit code
(:mod:`agentsessions.host.usercli.errors`). Errors are raised, never printed here; the runner in
``agentsessions.host.usercli`` turns them into one message and one exit code.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TextIO

import grpc
from google.protobuf.message import Message

from agentsessions.client import SessionsClient, text_message
from agentsessions.host import progress
from agentsessions.host.journal import canon
from agentsessions.host.usercli.connection import Connection
from agentsessions.host.usercli.errors import (
    EXIT_AWAITING,
    EXIT_FAILED,
    EXIT_OK,
    CommandFailed,
    UsageError,
    exit_code_of,
)
from agentsessions.host.usercli.render import (
    TurnView,
    compute_name,
    record_line,
    session_details,
    session_row,
    session_row_header,
    state_name,
    to_json,
)
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, session_pb2


@struct
class Call:
    """One command invocation: its flags, its host and where it prints."""

    args: argparse.Namespace
    connection: Connection
    client: SessionsClient
    out: TextIO
    err: TextIO

    @property
    def as_json(self) -> bool:
        return bool(self.args.json)

    @property
    def unary(self) -> dict[str, object]:
        """Keyword arguments of a unary call: the token metadata and the deadline."""
        return {"metadata": self.connection.metadata, "timeout": self.connection.timeout}

    @property
    def streaming(self) -> dict[str, object]:
        return {"metadata": self.connection.metadata, "timeout": self.connection.stream_timeout}

    def emit(self, message: Message) -> None:
        print(to_json(message), file=self.out, flush=True)

    def show(self, message: Message, line: str) -> None:
        """``message`` as JSON with ``--json``, else ``line``."""
        if self.as_json:
            self.emit(message)
        else:
            self.say(line)

    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def note(self, line: str) -> None:
        """A line for the person, on stderr, so stdout stays the command's result."""
        if not self.as_json:
            print(line, file=self.err, flush=True)


def _key_values(entries: Sequence[str] | None, flag: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for entry in entries or ():
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} {entry!r} must be KEY=VALUE")
        pairs[key] = value
    return pairs


def _session_line(session: session_pb2.Session) -> str:
    return (
        f"{session.metadata.uid} exec={state_name(session)} compute={compute_name(session)} "
        f"last_seq={session.last_seq}"
    )


# -- sessions ------------------------------------------------------------------------------------


async def create(call: Call) -> int:
    args = call.args
    session = session_pb2.Session(
        harness=args.harness,
        model=args.model,
        labels=_key_values(args.label, "--label"),
        annotations=_key_values(args.annotation, "--annotation"),
    )
    session.metadata.project = args.project
    session.metadata.name = args.name
    created: session_pb2.Session = await call.client.stub.CreateSession(
        session_pb2.CreateSessionRequest(session=session), **call.unary
    )
    if call.as_json:
        call.emit(created)
    else:
        call.say(created.metadata.uid)
    return EXIT_OK


async def list_sessions(call: Call) -> int:
    args = call.args
    if args.limit is not None and args.limit <= 0:
        raise UsageError(f"--limit {args.limit} must be positive")
    token, shown = "", 0
    if not call.as_json:
        call.say(session_row_header())
    while True:
        page = await call.client.stub.ListSessions(
            session_pb2.ListSessionsRequest(project=args.project, page_size=args.page_size, page_token=token),
            **call.unary,
        )
        for session in page.sessions:
            if args.limit is not None and shown >= args.limit:
                return EXIT_OK
            call.show(session, session_row(session))
            shown += 1
        token = page.next_page_token
        if not token:
            return EXIT_OK


async def get(call: Call) -> int:
    session = await _get_session(call, call.args.session)
    if call.as_json:
        call.emit(session)
    else:
        for line in session_details(session):
            call.say(line)
    return EXIT_OK


async def _get_session(call: Call, uid: str) -> session_pb2.Session:
    session: session_pb2.Session = await call.client.stub.GetSession(
        session_pb2.GetSessionRequest(uid=uid), **call.unary
    )
    return session


async def fork(call: Call) -> int:
    args = call.args
    names: list[str] = args.child_name or []
    count = args.count if args.count is not None else max(1, len(names))
    response = await call.client.stub.Fork(
        session_pb2.ForkRequest(
            session=args.session,
            at_seq=args.at,
            count=count,
            child_names=names,
            labels=_key_values(args.label, "--label"),
        ),
        **call.unary,
    )
    for child in response.children:
        call.show(child, child.metadata.uid)
    return EXIT_OK


async def suspend(call: Call) -> int:
    session = await call.client.stub.Suspend(
        session_pb2.SuspendRequest(session=call.args.session), **call.unary
    )
    return _print_session(call, session)


async def resume(call: Call) -> int:
    session = await call.client.stub.Resume(
        session_pb2.ResumeRequest(session=call.args.session), **call.unary
    )
    return _print_session(call, session)


async def cancel(call: Call) -> int:
    args = call.args
    session = await call.client.stub.Cancel(
        session_pb2.CancelRequest(session=args.session, execution_id=args.execution, reason=args.reason),
        **call.unary,
    )
    return _print_session(call, session)


async def delete(call: Call) -> int:
    session = await call.client.stub.DeleteSession(
        session_pb2.DeleteSessionRequest(uid=call.args.session), **call.unary
    )
    if call.as_json:
        call.emit(session)
    else:
        call.say(f"deleted {session.metadata.uid}")
    return EXIT_OK


def _print_session(call: Call, session: session_pb2.Session) -> int:
    call.show(session, _session_line(session))
    return EXIT_OK


# -- turns ---------------------------------------------------------------------------------------


def _inputs(words: Sequence[str], stdin: TextIO) -> list[common_pb2.Message]:
    if list(words) == ["-"]:
        return [text_message("user", stdin.read())]
    if not words:
        return []
    return [text_message("user", " ".join(words))]


def _config(args: argparse.Namespace) -> bytes:
    if args.config is not None and args.config_file is not None:
        raise UsageError("--config and --config-file are exclusive")
    if args.config_file is not None:
        try:
            return Path(args.config_file).read_bytes()
        except OSError as exc:
            raise UsageError(
                f"--config-file {args.config_file!r} cannot be read: {exc.strerror or exc}"
            ) from None
    return str(args.config or "").encode()


async def exec_turn(call: Call) -> int:
    args = call.args
    inputs = _inputs(args.text, sys.stdin)
    if not args.session and not inputs:
        raise UsageError("exec needs TEXT (the turn's input), or --session to continue an interrupted turn")
    if args.deadline is not None and not args.deadline > 0:
        raise UsageError(f"--deadline {args.deadline:g} must be a positive number of seconds")
    request = session_pb2.ExecRequest(
        session=args.session,
        inputs=inputs,
        harness=args.harness,
        config=_config(args),
        deadline_unix=int(time.time() + args.deadline) if args.deadline else 0,
    )
    if args.expected_last_seq is not None:
        request.expected_last_seq = args.expected_last_seq
    return await _stream_turn(call, request, created=not args.session)


def _view(call: Call) -> TurnView:
    # With --json the view only follows the outcome; what it would print is dropped.
    return TurnView(out=io.StringIO() if call.as_json else call.out, verbose=bool(call.args.verbose))


async def _stream_turn(
    call: Call, request: session_pb2.ExecRequest, *, created: bool, view: TurnView | None = None
) -> int:
    """Run one Exec, printing frames as they come; the exit code of the turn's outcome."""
    view = view or _view(call)
    uid = request.session
    try:
        async for update in call.client.stub.Exec(request, **call.streaming):
            if not uid and update.WhichOneof("update") == "session":
                uid = update.session.metadata.uid
                if created:
                    call.note(f"session {uid} (created)")
            if call.as_json:
                call.emit(update)
            view.update(update)
    except grpc.aio.AioRpcError as exc:
        if view.outcome != "failed":
            raise
        # The failure is journaled and was printed; the status only repeats it.
        call.note(f"turn failed ({exc.code().name}): {view.failure}")
        return EXIT_FAILED
    return await _turn_exit(call, view, uid)


async def _turn_exit(call: Call, view: TurnView, uid: str) -> int:
    outcome = view.outcome
    if not outcome:
        session = await _get_session(call, uid)
        outcome = {
            session_pb2.EXEC_AWAITING: "awaiting",
            session_pb2.EXEC_FAILED: "failed",
            session_pb2.EXEC_CANCELED: "cancelled",
        }.get(session.exec_state, "completed")
        if outcome == "awaiting":
            view.parked = session
    if outcome == "awaiting":
        ref = view.parked.pending_approval if view.parked is not None else common_pb2.ApprovalRef()
        call.note(
            f"parked: call {ref.tool_call_id} awaits approval (request #{ref.request_seq}); "
            f"decide with: agentsessions approve {uid}   (or: agentsessions deny {uid})"
        )
        return EXIT_AWAITING
    if outcome in ("failed", "cancelled"):
        call.note(f"turn {outcome}: {view.failure}" if view.failure else f"turn {outcome}")
        return EXIT_FAILED
    return EXIT_OK


async def decide(call: Call, *, approved: bool) -> int:
    """``approve``/``deny``: record the decision on the pending (or named) gate, then continue the
    turn with an Exec without inputs, streamed like ``exec``, unless ``--no-continue``."""
    args = call.args
    explicit = [args.execution, args.tool_call, args.request_seq]
    if any(value is not None for value in explicit):
        if args.execution is None or args.tool_call is None or args.request_seq is None:
            raise UsageError("name the gate with all of --execution, --tool-call and --request-seq, or none")
        ref = common_pb2.ApprovalRef(
            execution_id=args.execution, tool_call_id=args.tool_call, request_seq=args.request_seq
        )
    else:
        session = await _get_session(call, args.session)
        if not session.HasField("pending_approval"):
            raise CommandFailed(
                f"session {args.session} has no pending approval (state {state_name(session)}); a decision "
                "already recorded is delivered by `agentsessions resume`, or name the gate with "
                "--execution, --tool-call and --request-seq to retry one exactly"
            )
        ref = session.pending_approval
    request = session_pb2.ApproveRequest(
        session=args.session,
        execution_id=ref.execution_id,
        tool_call_id=ref.tool_call_id,
        request_seq=ref.request_seq,
        approved=approved,
        reason=args.reason,
    )
    if args.actor or args.issuer or args.subject:
        request.identity.CopyFrom(
            common_pb2.IdentityRef(principal=args.actor, issuer=args.issuer, subject=args.subject)
        )
    response = await call.client.stub.Approve(request, **call.unary)
    view = _view(call)
    # The gated call's name, for the lines that follow: its TOOL_CALL is the record before the request.
    async for earlier in _records(call, args.session, max(1, ref.request_seq - 1), ref.request_seq):
        view.learn(earlier)
    if call.as_json:
        call.emit(response)
    view.record(response.decision)
    call.note(f"decision recorded at seq {response.decision.seq}")
    if args.no_continue:
        call.note(f"`agentsessions resume {args.session}` delivers it and completes the turn")
        return EXIT_OK
    try:
        request_more = session_pb2.ExecRequest(session=args.session)
        return await _stream_turn(call, request_more, created=False, view=view)
    except grpc.aio.AioRpcError as exc:
        call.note(
            f"the decision is recorded at seq {response.decision.seq}; continuing the turn failed "
            f"({exc.code().name}: {exc.details()}); `agentsessions resume {args.session}` retries it"
        )
        return exit_code_of(exc)


# -- the journal ---------------------------------------------------------------------------------


async def _records(
    call: Call, uid: str, from_seq: int = 0, to_seq: int = 0
) -> AsyncIterator[common_pb2.LogRecord]:
    request = session_pb2.ReplayRequest(session=uid, from_seq=from_seq, to_seq=to_seq)
    async for record in call.client.stub.Replay(request, **call.streaming):
        yield record


async def log(call: Call) -> int:
    """``log``: the stored records verbatim (Sessions.Replay), one line each."""
    args = call.args
    view = TurnView(out=call.out) if args.turns else None
    # A bar only when the records go somewhere else than the terminal it is drawn on.
    total = None
    if progress.enabled() and not call.out.isatty():
        head = (await _get_session(call, args.session)).last_seq
        total = (args.to or head) - max(args.from_seq, 1) + 1
    with progress.progress(f"reading {args.session}", total=total, unit="records") as bar:
        async for record in _records(call, args.session, args.from_seq, args.to):
            if call.as_json:
                call.emit(record)
            elif view is not None:
                view.record(record)
            else:
                call.say(record_line(record))
            bar.advance()
    return EXIT_OK


async def watch(call: Call) -> int:
    """``watch``: follow a session live (LiveSessions.Watch): its records after ``--after``, then
    each new one as it becomes durable, rendered as ``exec`` renders a turn (``--json``: each
    update as proto3 JSON). A stream the host breaks is reopened after the last record seen."""
    args = call.args
    view = TurnView(out=call.out, verbose=bool(args.verbose))
    shown: tuple[int, int] | None = None
    updates = call.client.watch(
        args.session, after_seq=args.after, follow=not args.no_follow, include_deltas=not args.no_deltas
    )
    async for update in updates:
        if call.as_json:
            call.emit(update)
            continue
        which = update.WhichOneof("update")
        if which == "record":
            view.record(update.record)
        elif which == "delta":
            view.delta(update.delta)
        elif which == "session":
            session = update.session
            if shown is None:
                call.note(f"watching {_session_line(session)}")
            elif (session.exec_state, session.compute_state) != shown:
                view.state(session)
            shown = (session.exec_state, session.compute_state)
        elif which == "queue":
            view.queue(len(update.queue.turns))
    return EXIT_OK


@struct
class ChainCheck:
    """Recomputes a chain record by record (spec 3.2) with the host's canonical hashing."""

    uid: str
    count: int = 0
    head: str = ""
    failed_seq: int = 0
    why: str = ""

    def take(self, record: common_pb2.LogRecord) -> bool:
        """Check the next record; False (and ``why``) at the first one that does not verify."""
        expected = self.count + 1
        if record.seq != expected:
            self.why = f"seq {expected} is missing (found seq {record.seq})"
        elif record.prev_hash != self.head:
            self.why = "prev_hash does not link to the previous record"
        elif canon.content_hash(record.event, self.head, record.seq) != record.content_hash:
            self.why = "content_hash does not match the recomputed hash"
        if self.why:
            self.failed_seq = expected if record.seq != expected else record.seq
            return False
        self.count, self.head = expected, record.content_hash
        return True


async def verify(call: Call) -> int:
    """``verify``: replay each session over the wire and recompute its chain from genesis."""
    failures = 0
    for uid in call.args.session:
        session = await _get_session(call, uid)
        check = ChainCheck(uid)
        with progress.progress(f"verifying {uid}", total=session.last_seq, unit="records") as bar:
            async for record in _records(call, uid):
                if not check.take(record):
                    break
                bar.advance()
        if not check.why and check.count < session.last_seq:
            check.failed_seq, check.why = (
                check.count + 1,
                f"the host returned {check.count} of {session.last_seq} records",
            )
        failures += bool(check.why)
        _print_check(call, check)
    return EXIT_FAILED if failures else EXIT_OK


def _print_check(call: Call, check: ChainCheck) -> None:
    if call.as_json:
        body: dict[str, object] = {"session": check.uid, "verified": not check.why, "records": check.count}
        if check.why:
            body.update(failedSeq=check.failed_seq, why=check.why)
        else:
            body["headHash"] = check.head
        call.say(json.dumps(body))
    elif check.why:
        call.say(f"FAILED: session {check.uid} seq {check.failed_seq}: {check.why}")
    else:
        chain = f"chain of {check.count} records verifies from genesis"
        call.say(f"ok: session {check.uid}: {chain} (head {check.head[:16]})")
