"""Structured results: a turn bound to a JSON Schema settles with data that satisfies it.

A schema-bound turn carries its schema in the journal, as the last INPUT of its execution, written
by the host (``actor.principal`` :data:`RESULTS_PRINCIPAL`, ``actor.subject`` ``attempt:K/N``): a
text part telling the harness what to answer, whose last line is the schema as JSON. The harness
sees it as an ordinary input. When the harness completes, :class:`Settler` takes the execution's
final OUTPUT, reads it as JSON and validates it (:func:`validate_result`):

* valid: an OUTPUT holding the result as a data part (same actor), then ``END{COMPLETED}``;
* invalid with corrections left (K < N): ``END{COMPLETED}`` of this execution, and in the same
  append the next execution's EXECUTION_START and its INPUT (attempt K+1) saying what failed;
  that execution is then driven like a recovered one;
* invalid with none left: ``END{FAILED}``, error ``result_schema_invalid: <the last error>``.

Everything the decision needs is in the journal, so a recovered execution settles the same way
(its harness consumes its recorded effects, zero model calls, and the same output meets the same
schema), and a replay serves the settlement OUTPUT to nobody: it is the host's record, not an
effect (``executions.recorded_effects`` skips it; ``Start.conversation`` leaves it out).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from agentsessions.host.controller.errors import InvalidArgumentError
from agentsessions.host.journal.store import SessionNotFoundError
from agentsessions.sdk import jsonvalues
from agentsessions.sdk.extensions import RESULTS_PRINCIPAL
from agentsessions.sdk.harness import Start, message_text, text_message
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

if TYPE_CHECKING:  # the Core holds the Driver that calls a Settler: no import cycle at run time
    from agentsessions.host.controller.core import Core
    from agentsessions.host.controller.sink import ExecutionSink
    from agentsessions.host.controller.writer import ExecutionWriter

K = common_pb2

DEFAULT_CORRECTIONS: Final = 2
MAX_CORRECTIONS: Final = 10
# A schema is journaled in every input of its turn: kept well under a record.
MAX_SCHEMA_BYTES: Final = 64 * 1024
FAILURE: Final = "result_schema_invalid"
# What a corrective turn's INPUT says of the failure at most (characters).
MAX_FAILED_CHARS: Final = 4000
# The request metadata that binds an Exec to a schema (JSON text).
METADATA_KEY: Final = "agentsessions-result-schema"

_ATTEMPT = re.compile(r"attempt:(\d+)/(\d+)")
_ASK = "Answer with only a JSON object that satisfies the JSON Schema on the next line."


class ResultSchemaError(ValueError):
    """A schema that is not a valid JSON Schema, or one this host will not take."""


def check_schema(schema: object) -> dict[str, Any]:
    """The schema as a JSON object, checked against its JSON Schema metaschema (``$schema``, else
    the latest draft); :class:`ResultSchemaError` naming the rule otherwise."""
    if not isinstance(schema, Mapping):
        raise ResultSchemaError(f"must be a JSON object (a JSON Schema), got {_json_type(schema)}")
    value = dict(schema)
    try:
        jsonvalues.check_json(value, "result_schema")
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError) as exc:
        raise ResultSchemaError(f"is not JSON a journal can hold: {exc}") from None
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise ResultSchemaError(f"is {len(text.encode())} bytes of JSON, more than {MAX_SCHEMA_BYTES}")
    # Imported here: jsonschema costs start-up ~40 ms, and only turns bound to a schema need it.
    import jsonschema.exceptions
    import jsonschema.validators

    try:
        validator = jsonschema.validators.validator_for(value)
        validator.check_schema(value)
    except jsonschema.exceptions.SchemaError as exc:
        where = "".join(f"[{p!r}]" for p in exc.path) or " (the root)"
        raise ResultSchemaError(f"is not a valid JSON Schema: at{where}: {exc.message}") from None
    except jsonschema.exceptions.UnknownType as exc:  # an unknown "type" name
        raise ResultSchemaError(f"is not a valid JSON Schema: {exc}") from None
    return value


def validate_result(result: Any, schema: Mapping[str, Any]) -> str | None:
    """Why ``result`` does not satisfy ``schema`` (a checked JSON Schema), or None when it does.

    The one validation of a structured result: turns settle with it, and other code (a subagent's
    result, say) may call it the same way. ``$ref``s resolve within the schema only; nothing is
    fetched."""
    import jsonschema.exceptions
    import jsonschema.validators

    validator_type = jsonschema.validators.validator_for(schema)
    validator = validator_type(schema)
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(result))
    except jsonschema.exceptions.SchemaError as exc:  # checked up front; a journal may hold any
        return f"the schema is not a valid JSON Schema: {exc.message}"
    except Exception as exc:  # an unresolvable $ref is the schema's fault, said as such
        return f"the schema could not be applied: {exc}"
    if error is None:
        return None
    where = "".join(f"[{p!r}]" for p in error.absolute_path) or " the root"
    return f"at{where}: {error.message}"


def result_of(message: common_pb2.Message | None) -> tuple[Any, str | None]:
    """The JSON a final output holds (its first data part, else its text as JSON, a Markdown code
    fence around it allowed), and why there is none."""
    if message is None:
        return None, "the turn produced no output"
    for part in message.parts:
        if part.WhichOneof("part") == "data":
            return jsonvalues.dict_from_struct(part.data.data), None
    text = message_text(message).strip()
    fenced = re.fullmatch(r"```[A-Za-z0-9_-]*\s*\n(.*?)\n?```", text, re.DOTALL)
    if fenced is not None:
        text = fenced.group(1).strip()
    if not text:
        return None, "the final output is empty, not JSON"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"the final output is not JSON: {exc}"


def check(result: Any, schema: Mapping[str, Any]) -> str | None:
    """Why a turn's result does not settle: not an object (a data part holds one), or not valid."""
    if not isinstance(result, dict):
        return f"the result must be a JSON object, got {_json_type(result)}"
    try:
        jsonvalues.check_json(result, "result")
    except ValueError as exc:
        return f"the result is not JSON a journal can hold: {exc}"
    return validate_result(result, schema)


@struct(frozen=True)
class Binding:
    """The schema an execution is bound to, and which attempt of how many it is."""

    schema: dict[str, Any]
    attempt: int
    corrections: int


def schema_input(execution_id: str, b: Binding, failed: str = "") -> common_pb2.Event:
    """The host's INPUT that binds an execution: what to answer (and what failed), the schema."""
    if len(failed) > MAX_FAILED_CHARS:  # a validation message quotes the answer: kept well under a record
        failed = failed[:MAX_FAILED_CHARS] + "..."
    lines = [f"Your previous answer did not satisfy the result schema: {failed}"] if failed else []
    lines += [_ASK, json.dumps(b.schema, sort_keys=True, separators=(",", ":"))]
    return K.Event(
        execution_id=execution_id,
        kind=K.EVENT_INPUT,
        message=text_message("user", "\n".join(lines)),
        actor=K.IdentityRef(principal=RESULTS_PRINCIPAL, subject=f"attempt:{b.attempt}/{b.corrections}"),
    )


def binding_of(inputs: list[common_pb2.Event]) -> Binding | None:
    """The binding the execution's INPUT events carry (the host's last one), None: not bound."""
    for event in reversed(inputs):
        if event.actor.principal != RESULTS_PRINCIPAL:
            continue
        found = _ATTEMPT.fullmatch(event.actor.subject)
        text = message_text(event.message)
        if found is None or "\n" not in text:
            return None
        try:
            schema = json.loads(text.rsplit("\n", 1)[1])
        except json.JSONDecodeError:
            return None
        if not isinstance(schema, dict):
            return None
        return Binding(schema, int(found.group(1)), int(found.group(2)))
    return None


def is_settlement(event: common_pb2.Event) -> bool:
    """An OUTPUT the host wrote to settle a structured result (not an effect of the harness)."""
    return event.kind == K.EVENT_OUTPUT and event.actor.principal == RESULTS_PRINCIPAL


def execution_tail(events: Sequence[common_pb2.Event], execution_id: str) -> list[common_pb2.Event]:
    """The records of the session's last execution ``execution_id``, read back from the journal's
    end to its EXECUTION_START (a turn's settling costs its own records, not the session's)."""
    mine: list[common_pb2.Event] = []
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if event.execution_id == execution_id:
            mine.append(event)
            if event.kind == K.EVENT_EXECUTION_START:
                break
    mine.reverse()
    return mine


def judge(mine: list[common_pb2.Event]) -> tuple[Binding, Any, str | None] | None:
    """An execution's binding, its result and why it does not settle (None: it does), from its
    records alone; None when the execution is not bound to a schema."""
    binding = binding_of([e for e in mine if e.kind == K.EVENT_INPUT])
    if binding is None:
        return None
    outputs = [e for e in mine if e.kind == K.EVENT_OUTPUT and not is_settlement(e)]
    result, error = result_of(outputs[-1].message if outputs else None)
    return binding, result, error if error is not None else check(result, binding.schema)


def replayed(mine: list[common_pb2.Event]) -> str | None:
    """How a completed execution's recorded settlement differs from the one its records decide
    (None: the same, or not bound): a replay checks it, as it checks every effect."""
    judged = judge(mine)
    if judged is None:
        return None
    binding, result, error = judged
    ends = [e for e in mine if e.kind == K.EVENT_END]
    settled = [e for e in mine if is_settlement(e)]
    state = ends[-1].end.state if ends else ""
    if error is None:
        if not settled or jsonvalues.dict_from_struct(settled[-1].message.parts[0].data.data) != result:
            return "the recorded settled result is not the result its final output holds"
        return None if state == "COMPLETED" else f"a valid result ended {state or 'without END'}"
    if settled:
        return f"a result was settled although the final output does not validate: {error}"
    if binding.attempt >= binding.corrections and state != "FAILED":
        return f"a result that does not validate ({error}) ended {state or 'without END'}, not FAILED"
    return None


@struct(frozen=True)
class Settled:
    """A bound execution's ending is journaled; ``parked``: a correction that stopped at a gate."""

    parked: common_pb2.LogRecord | None = None


Settle = Callable[[str, Start, "ExecutionSink", "ExecutionWriter"], Awaitable[Settled | None]]


class Settler:
    """Journals how a schema-bound execution ends (the Driver's ``settle`` hook)."""

    def __init__(self, core: Core) -> None:
        self.core = core

    async def __call__(
        self, uid: str, start: Start, sink: ExecutionSink, writer: ExecutionWriter
    ) -> Settled | None:
        core = self.core
        # The execution's own records, as its writer made them durable (no store read per turn),
        # and the answer of its last model call, which may be ordered but not yet written: an
        # unbound turn's END then shares that answer's commit.
        events = core.cache.written(uid) or await core.cache.events(uid)
        judged = judge(execution_tail(events, start.execution_id) + writer.ordered())
        if judged is None:
            return None  # not bound: the Driver ends it as any other
        await writer.flushed()
        binding, result, error = judged
        end = K.Event(execution_id=start.execution_id, kind=K.EVENT_END)
        if error is None:
            data = K.Part(data=K.DataPart(data=jsonvalues.struct_from_dict(result, "result")))
            await writer.append(
                K.Event(
                    execution_id=start.execution_id,
                    kind=K.EVENT_OUTPUT,
                    message=K.Message(role="assistant", parts=[data]),
                    actor=K.IdentityRef(principal=RESULTS_PRINCIPAL, subject="result"),
                )
            )
            end.end.state = "COMPLETED"
            await writer.append(end)
            return Settled()
        if binding.attempt >= binding.corrections:
            end.end.state = "FAILED"
            end.end.error.description = f"{FAILURE}: {error}" + (
                f" (after {binding.corrections} corrective turn(s))" if binding.corrections else ""
            )
            end.end.error.code = 3  # INVALID_ARGUMENT: the answer broke the caller's schema
            await writer.append(end)
            return Settled()
        return Settled(await self._correct(uid, start, sink, writer, binding, error, events))

    async def _correct(
        self,
        uid: str,
        start: Start,
        sink: ExecutionSink,
        writer: ExecutionWriter,
        binding: Binding,
        error: str,
        events: Sequence[common_pb2.Event],
    ) -> common_pb2.LogRecord | None:
        """End this execution and admit the corrective one in one append, then drive it."""
        # Imported here: recovery imports the Core, which holds the Driver that holds this hook.
        from agentsessions.host.controller import recovery, sessions

        core = self.core
        recorded = execution_tail(events, start.execution_id)[0].execution_start
        next_id = core.new_id()
        follow = Binding(binding.schema, binding.attempt + 1, binding.corrections)
        batch = [
            K.Event(execution_id=start.execution_id, kind=K.EVENT_END, end=K.HarnessEnd(state="COMPLETED")),
            K.Event(
                execution_id=next_id,
                kind=K.EVENT_EXECUTION_START,
                execution_start=K.ExecutionStart(
                    config=recorded.config,
                    resume_from_seq=recorded.resume_from_seq,
                    input_count=1,
                    harness=recorded.harness,
                    harness_version=recorded.harness_version,
                ),
            ),
            schema_input(next_id, follow, error),
        ]
        # Admitted as a new turn is (with its lease, on a host with leases): a crash from here on
        # leaves a corrective turn the recoverer finishes.
        records = await core.admission.follow_on(core, uid, batch, writer.head, writer.fence)
        writer.head, writer.fence = records[-1].seq, records[-1].fence
        if writer.on_record is not None:
            for rec in records:
                await writer.on_record(rec)
        row = await core.store.get_session(uid)
        if row is None:
            raise SessionNotFoundError(f"session {uid!r} not found")
        _, executions = await sessions.read(core, row)
        corrective = next(e for e in executions if e.id == next_id)
        return await recovery.redrive(
            core,
            row,
            corrective,
            "create",
            fence=writer.fence,
            on_record=writer.on_record,
            on_delta=sink.delta_sink,
        )


def bind_turn(schema: Mapping[str, Any] | None, corrections: int) -> Binding | None:
    """The binding a new turn gets from its request's schema (checked by the service first)."""
    return None if schema is None else Binding(dict(schema), 0, corrections)


def parse_metadata(value: str | bytes) -> dict[str, Any]:
    """The ``agentsessions-result-schema`` metadata's schema; :class:`ResultSchemaError` otherwise."""
    if not isinstance(value, str):
        raise ResultSchemaError("must be JSON text, not binary metadata")
    try:
        schema = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ResultSchemaError(f"is not JSON: {exc}") from None
    return check_schema(schema)


def field_error(field: str, exc: ResultSchemaError) -> InvalidArgumentError:
    return InvalidArgumentError(field, str(exc))


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__
