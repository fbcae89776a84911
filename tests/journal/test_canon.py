"""Canonical hashing: the spec 3.4 vectors, the Go-written fixture journals, and the direct JCS
writer held byte-identical to json_format + rfc8785 by property tests."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
import rfc8785
from google.protobuf import json_format, struct_pb2
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentsessions.host.journal import canon, gojson
from agentsessions.v1 import common_pb2, harness_registry_pb2
from tests.fixtures import GO_JOURNALS

FIXTURES = GO_JOURNALS
FIXTURE_FILES = sorted(FIXTURES.glob("*.json"))

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def _event(js: str) -> common_pb2.Event:
    return json_format.Parse(js, common_pb2.Event())


# -- spec 3.4 ---------------------------------------------------------------------------------

# (canonical event JSON, content hash at seq 1 after the genesis prev_hash "")
SPEC_VECTORS = [
    pytest.param(
        '{"actor":{"issuer":"entra","principal":"agent://a","subject":"sub-1"},"execution_id":"exec-1",'
        '"kind":"EVENT_OUTPUT","message":{"parts":[{"text":{"text":"hello"}}],"role":"assistant"},'
        '"schema_version":1,"ts":"2023-11-14T22:13:20Z"}',
        "551bd146050c8d630b0c3b999a4445f3792a470db9bca443d8d4a67706283fcc",
        id="1-golden",
    ),
    pytest.param(
        '{"execution_id":"exec-config","execution_start":{"config":"AP8gCgk=","input_count":"2",'
        '"resume_from_seq":"9007199254740993"},"kind":"EVENT_EXECUTION_START"}',
        "aa1f42a26b7a227836d32d31608ebb69c59f3b1c57eadd8537b6faf88a01c790",
        id="2-execution-start-config",
    ),
    pytest.param(
        '{"execution_id":"exec-default","execution_start":{"input_count":"0"},"kind":"EVENT_EXECUTION_START"}',
        "b09cbff45d5a30990c3b72be8b06af6bc509d5a29a849aab5fd42153ef10ec65",
        id="3-input-count-0",
    ),
    pytest.param(
        '{"execution_id":"exec-default","execution_start":{"input_count":"2"},"kind":"EVENT_EXECUTION_START"}',
        "f06c25ee5b3673ee23b8f91883c7f1c6c5682d94986caf5bc067908a61b2ac4f",
        id="3-input-count-2",
    ),
    pytest.param(
        '{"kind":"EVENT_INPUT","message":{"parts":[{"text":{"text":"hello"}}],"role":"user"}}',
        "62daf59c5c1e5062b1b0d47d5665b34aa52bf7ed0ca8a0b016af2c9827b5d8f6",
        id="4-v0.1.2-input",
    ),
    pytest.param(
        '{"kind":"EVENT_TOOL_RESULT","result":{"id":"c1"}}',
        "2eddf9826b382796691c15da8ee7dd6af7b41dbab55c949f131ed2933e0b0d8e",
        id="5-legacy-receipt",
    ),
    pytest.param(
        '{"approval_result":{"reason":"no","tool_call_id":"c1"},"kind":"EVENT_APPROVAL_RESULT"}',
        "c36a909b1ea5f243536ff6b4f1770e99e47b35cb1dfb94c2e943b85a42206bea",
        id="5-legacy-decision",
    ),
]


@pytest.mark.parametrize(("event_json", "expected"), SPEC_VECTORS)
def test_spec_vectors_hash(event_json: str, expected: str) -> None:
    ev = _event(event_json)
    assert canon.canonical_event(ev).decode() == event_json
    assert canon.content_hash(ev, "", 1) == expected
    assert canon.reference_content_hash(ev, "", 1) == expected


@pytest.mark.parametrize(
    "event_json",
    [
        '{"execution_id":"e1","kind":"EVENT_TOOL_RESULT","result":{"approval_decision_seq":"9007199254740994",'
        '"approval_request_seq":"9007199254740993","code":"APPROVAL_DENIED","id":"c1","is_error":true}}',
        '{"actor":{"principal":"human"},"approval_result":{"reason":"no","request_seq":"9007199254740993",'
        '"tool_call_id":"c1"},"execution_id":"e1","kind":"EVENT_APPROVAL_RESULT"}',
    ],
    ids=["6-receipt", "6-decision"],
)
def test_spec_vector_6_canonical_bytes(event_json: str) -> None:
    assert canon.canonical_event(_event(event_json)).decode() == event_json


def test_every_decision_field_changes_the_hash() -> None:
    base = _event(
        '{"actor":{"principal":"human"},"approval_result":{"reason":"no","request_seq":"7",'
        '"tool_call_id":"c1"},"execution_id":"e1","kind":"EVENT_APPROVAL_RESULT"}'
    )
    changes: list[tuple[str, str, object]] = [
        ("approval_result", "request_seq", 8),
        ("approval_result", "approved", True),
        ("approval_result", "reason", "yes"),
        ("actor", "principal", "someone-else"),
    ]
    hashes = {canon.content_hash(base, "", 1)}
    for sub, name, value in changes:
        ev = common_pb2.Event()
        ev.CopyFrom(base)
        setattr(getattr(ev, sub), name, value)
        hashes.add(canon.content_hash(ev, "", 1))
    assert len(hashes) == 1 + len(changes)


def test_chain_binding_prev_and_seq_change_the_hash() -> None:
    ev = _event('{"kind":"EVENT_INPUT","message":{"parts":[{"text":{"text":"hello"}}],"role":"user"}}')
    at_1 = canon.content_hash(ev, "", 1)
    assert canon.content_hash(ev, "", 2) != at_1
    assert canon.content_hash(ev, "0" * 64, 1) != at_1
    assert canon.content_hash(ev, "", 1) == at_1  # deterministic


def test_spec_vector_7_registry_spec_digest() -> None:
    spec = json_format.Parse(
        '{"capabilities":{"resumability":"RESUMABILITY_STATELESS_REPLAY"},"descriptor_id":"echo",'
        '"remote":{"address":"127.0.0.1:9000"}}',
        harness_registry_pb2.HarnessSpec(),
    )
    assert (
        canon.spec_digest(spec) == "sha256:f0c96c8b67d5dc75be557f64ccd59496eaf9cfb102754ee54e9d4c571eb2eafc"
    )


# -- Go-written journals ----------------------------------------------------------------------


def test_fixture_directory_is_complete() -> None:
    assert len(FIXTURE_FILES) == 10, f"expected the 10 v0.1.2 fixture journals under {FIXTURES}"


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=[p.stem for p in FIXTURE_FILES])
def test_fixture_journal_reproduces_every_hash(path: Path) -> None:
    records = gojson.load_records(path)
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert len(records) == len(raw) > 0
    prev = ""
    for i, rec in enumerate(records, start=1):
        assert rec.seq == i
        assert rec.prev_hash == prev, f"seq {rec.seq}: PrevHash does not link"
        assert canon.content_hash(rec.event, rec.prev_hash, rec.seq) == rec.hash, f"seq {rec.seq}"
        assert canon.reference_content_hash(rec.event, rec.prev_hash, rec.seq) == rec.hash
        prev = rec.hash


def test_go_conversion_drops_absent_values() -> None:
    ev = gojson.event_from_go(
        {
            "ExecutionID": "",
            "Timestamp": "0001-01-01T00:00:00Z",
            "SchemaVersion": 0,
            "Kind": "EXECUTION_START",
            "ExecutionStart": {"Config": None, "InputCount": 0, "ResumeFromSeq": 0},
            "Actor": {"Principal": "", "Issuer": "", "Subject": ""},
        }
    )
    assert (
        canon.canonical_event(ev) == b'{"execution_start":{"input_count":"0"},"kind":"EVENT_EXECUTION_START"}'
    )


def test_go_conversion_rejects_unknown_fields() -> None:
    with pytest.raises(gojson.GoJournalError, match="Surprise"):
        gojson.event_from_go({"Kind": "INPUT", "Surprise": 1})


# -- RFC 8785 number serialization ------------------------------------------------------------

# RFC 8785 appendix B: IEEE 754 bit patterns and their ECMAScript serialization.
RFC8785_NUMBERS = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


def _number(x: float) -> bytes:
    return canon.canonical_json(struct_pb2.Value(number_value=x))


@pytest.mark.parametrize(("bits", "expected"), RFC8785_NUMBERS)
def test_rfc8785_appendix_numbers(bits: str, expected: str) -> None:
    (x,) = struct.unpack(">d", bytes.fromhex(bits))
    assert _number(x).decode() == expected
    assert rfc8785.dumps(x).decode() == expected


@settings(max_examples=3000)
@given(st.floats(allow_nan=False, allow_infinity=False))
@example(0.0)
@example(-0.0)
@example(1e21)
@example(1e-7)
@example(1e-6)
@example(2.0**53)
@example(-(2.0**53) + 1)
@example(5e-324)
@example(1.7976931348623157e308)
@example(123456789012345680000.0)
def test_number_matches_rfc8785(x: float) -> None:
    assert _number(x) == rfc8785.dumps(x)


def test_non_finite_struct_numbers_are_refused_like_the_reference() -> None:
    for bad in (math.inf, -math.inf, math.nan):
        value = struct_pb2.Value(number_value=bad)
        with pytest.raises(ValueError):
            canon.reference_canonical_json(value)
        with pytest.raises(ValueError):
            canon.canonical_json(value)


# -- property tests: direct writer == json_format + rfc8785 -----------------------------------

# Arbitrary Unicode, including astral-plane characters (surrogate pairs in UTF-16) and controls.
_text = st.text(st.characters(codec="utf-8"), max_size=12)
_keys = st.one_of(
    _text, st.sampled_from(["", "a", "\ue000", "\uffff", "\U00010000", "\U0001f600", "\x00", '"'])
)
_json_numbers = st.floats(allow_nan=False, allow_infinity=False)
_json = st.recursive(
    st.none() | st.booleans() | _json_numbers | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=20,
)
_int64 = st.integers(INT64_MIN, INT64_MAX)
_int32 = st.integers(-(2**31), 2**31 - 1)


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


@settings(max_examples=400)
@given(st.dictionaries(_keys, _json, max_size=6))
@example({"\uffff": 1, "\U00010000": 2, "\ue000": 3, "a": [1.5, None, True, "x\n\u2028"]})
def test_struct_matches_reference(value: dict[str, Any]) -> None:
    msg = _struct(value)
    assert canon.canonical_json(msg) == canon.reference_canonical_json(msg)


def test_keys_sort_by_utf16_code_units() -> None:
    msg = _struct({"\uffff": 1, "\U00010000": 2, "a": 3})
    # U+10000 is D800 DC00 in UTF-16, which sorts before FFFF (code point order would not).
    assert canon.canonical_json(msg) == '{"a":3,"\U00010000":2,"\uffff":1}'.encode()
    assert canon.reference_canonical_json(msg) == canon.canonical_json(msg)


@st.composite
def _parts(draw: st.DrawFn, depth: int = 0) -> common_pb2.Part:
    part = common_pb2.Part()
    kind = draw(st.sampled_from(["text", "file", "data", "reasoning", "tool_call", "tool_result"]))
    if kind == "text":
        part.text.text = draw(_text)
    elif kind == "file":
        part.file.mime = draw(_text)
        part.file.name = draw(_text)
        source = draw(st.sampled_from(["none", "bytes", "uri"]))
        if source == "bytes":
            part.file.bytes = draw(st.binary(max_size=16))
        elif source == "uri":
            part.file.uri = draw(_text)
    elif kind == "data":
        part.data.data.CopyFrom(_struct(draw(st.dictionaries(_keys, _json, max_size=3))))
    elif kind == "reasoning":
        part.reasoning.provider = draw(_text)
        part.reasoning.ordinal = draw(_int32)
        if draw(st.booleans()):
            part.reasoning.opaque_bytes = draw(st.binary(max_size=8))
        if depth < 2:
            for sub in draw(st.lists(_parts(depth + 1), max_size=2)):
                part.reasoning.summary.append(sub)
    elif kind == "tool_call":
        part.tool_call.id = draw(_text)
        part.tool_call.mediation = common_pb2.Mediation.ValueType(
            draw(st.integers(0, 5))
        )  # 4 and 5 are unknown (open enum)
        if draw(st.booleans()):
            part.tool_call.args.CopyFrom(_struct(draw(st.dictionaries(_keys, _json, max_size=3))))
    else:
        part.tool_result.id = draw(_text)
        part.tool_result.approval_request_seq = draw(_int64)
        part.tool_result.is_error = draw(st.booleans())
        if depth < 2:
            for sub in draw(st.lists(_parts(depth + 1), max_size=2)):
                part.tool_result.content.append(sub)
    return part


@st.composite
def _events(draw: st.DrawFn) -> common_pb2.Event:
    ev = common_pb2.Event(
        execution_id=draw(_text),
        schema_version=draw(_int32),
        kind=common_pb2.EventKind.ValueType(
            draw(st.integers(0, 15))
        ),  # includes numbers the enum does not name
    )
    if draw(st.booleans()):
        ev.ts.seconds = draw(st.integers(-62135596800, 253402300799))
        ev.ts.nanos = draw(st.integers(0, 999_999_999))
    if draw(st.booleans()):
        ev.actor.principal = draw(_text)
        ev.actor.subject = draw(_text)
    body = draw(
        st.sampled_from(["none", "message", "model", "result", "usage", "lifecycle", "start", "approval"])
    )
    if body == "message":
        ev.message.role = draw(_text)
        ev.message.SetInParent()
        for part in draw(st.lists(_parts(), max_size=4)):
            ev.message.parts.append(part)
    elif body == "model":
        ev.model.model = draw(_text)
        ev.model.id = draw(_text)
        for key, val in draw(st.dictionaries(_keys, _text, max_size=4)).items():
            ev.model.params[key] = val
    elif body == "result":
        ev.result.id = draw(_text)
        ev.result.approval_decision_seq = draw(_int64)
        ev.result.code = common_pb2.ToolResult.Code.ValueType(draw(st.integers(0, 2)))
        if draw(st.booleans()):
            ev.result.output.CopyFrom(_struct(draw(st.dictionaries(_keys, _json, max_size=3))))
        for part in draw(st.lists(_parts(), max_size=2)):
            ev.result.content.append(part)
    elif body == "usage":
        ev.usage.input_tokens = draw(_int64)
        ev.usage.output_tokens = draw(_int64)
        ev.usage.reasoning_tokens = draw(_int64)
    elif body == "lifecycle":
        ev.lifecycle.kind = common_pb2.Lifecycle.Kind.ValueType(draw(st.integers(0, 5)))
        ev.lifecycle.detail = draw(_text)
        ev.lifecycle.snapshot_memory = draw(st.booleans())
    elif body == "start":
        ev.execution_start.config = draw(st.binary(max_size=16))
        ev.execution_start.resume_from_seq = draw(_int64)
        if draw(st.booleans()):
            ev.execution_start.input_count = draw(_int64)
        ev.execution_start.SetInParent()
    elif body == "approval":
        ev.approval_result.tool_call_id = draw(_text)
        ev.approval_result.approved = draw(st.booleans())
        ev.approval_result.request_seq = draw(_int64)
    return ev


@settings(max_examples=400)
@given(_events(), _text, st.integers(1, INT64_MAX))
def test_event_hash_matches_reference(ev: common_pb2.Event, prev: str, seq: int) -> None:
    assert canon.canonical_event(ev) == canon.reference_canonical_json(ev)
    assert canon.content_hash(ev, prev, seq) == canon.reference_content_hash(ev, prev, seq)


@settings(max_examples=200)
@given(_events())
def test_hash_survives_the_storage_round_trip(ev: common_pb2.Event) -> None:
    stored = common_pb2.Event.FromString(canon.normalize_event(ev).SerializeToString())
    assert canon.content_hash(stored, "", 1) == canon.content_hash(canon.normalize_event(ev), "", 1)


# -- normalization (spec 3.3) -----------------------------------------------------------------


def test_normalize_drops_an_all_empty_actor() -> None:
    ev = common_pb2.Event(kind=common_pb2.EVENT_INPUT)
    ev.actor.SetInParent()
    out = canon.normalize_event(ev)
    assert not out.HasField("actor")
    assert ev.HasField("actor"), "the argument must not be mutated"
    kept = common_pb2.Event(kind=common_pb2.EVENT_INPUT, actor=common_pb2.IdentityRef(issuer="x"))
    assert canon.normalize_event(kept).actor.issuer == "x"


def test_normalize_strips_wire_only_model_call_fields() -> None:
    ev = common_pb2.Event(kind=common_pb2.EVENT_MODEL_CALL)
    ev.model.model = "echo"
    ev.model.input_hash = "h"
    ev.model.id = "m1"
    ev.model.params["temperature"] = "0"
    ev.model.messages.add(role="user").parts.add().text.text = "hi"
    ev.model.tools.add(name="t")
    ev.model.tool_choice.mode = common_pb2.ToolChoice.MODE_AUTO
    out = canon.normalize_event(ev)
    assert canon.canonical_event(out) == (
        b'{"kind":"EVENT_MODEL_CALL","model":{"id":"m1","input_hash":"h","model":"echo",'
        b'"params":{"temperature":"0"}}}'
    )
    assert len(ev.model.messages) == 1


def test_normalize_clears_empty_oneof_sources_in_nested_parts() -> None:
    ev = common_pb2.Event(kind=common_pb2.EVENT_TOOL_RESULT)
    outer = ev.result.content.add()
    outer.reasoning.opaque_uri = ""
    inner = outer.reasoning.summary.add()
    inner.file.bytes = b""
    nested_result = ev.result.content.add()
    nested_result.tool_result.content.add().file.uri = ""
    out = canon.normalize_event(ev)
    assert out.result.content[0].reasoning.WhichOneof("opaque") is None
    assert out.result.content[0].reasoning.summary[0].file.WhichOneof("source") is None
    assert out.result.content[1].tool_result.content[0].file.WhichOneof("source") is None
    assert canon.canonical_event(out) == (
        b'{"kind":"EVENT_TOOL_RESULT","result":{"content":[{"reasoning":{"summary":[{"file":{}}]}},'
        b'{"tool_result":{"content":[{"file":{}}]}}]}}'
    )


def test_normalize_keeps_present_values_and_returns_normal_events_as_is() -> None:
    ev = common_pb2.Event(kind=common_pb2.EVENT_OUTPUT)
    part = ev.message.parts.add()
    part.file.bytes = b"\x00"
    ev.message.parts.add().reasoning.opaque_uri = "s3://x"
    assert canon.normalize_event(ev) is ev
