"""The model-input hash (``ModelCall.input_hash``, invariant I0), defined in this one place (the
host checks it on replay; the SDK and its test kit compute it for a harness).

On replay and recovery the host recomputes the hash of the request a harness re-issues and
compares it with the recorded one; a mismatch is divergence and no provider is called.

The hash only pairs a live call with its own replay, so any stable function would do; this
host uses the Go reference's function so that journals written by the Go host replay here
too. It is the lowercase hex SHA-256 of Go's ``encoding/json`` encoding of the reference's
``ModelRequest`` struct: fields in declaration order under their Go names, no whitespace,
nil slices/maps/pointers as ``null``, bytes as padded standard base64, map keys sorted,
``<`` ``>`` ``&`` U+2028 U+2029 escaped, floats in Go's shortest form. The receipt fields of
``ToolResult`` parts (``Code``, ``ApprovalRequestSeq``, ``ApprovalDecisionSeq``) are this
host's own extension, emitted only when set.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from decimal import Decimal

from google.protobuf import struct_pb2

from agentsessions.v1 import common_pb2

_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\b": "\\b",
    "\f": "\\f",
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}


# json.dumps with a keyword builds an encoder at every call (~0.8 us); one made once is ~0.1 us.
_encode_string = json.JSONEncoder(ensure_ascii=False).encode


def _str(s: str) -> str:
    # The C encoder writes what Go does (short escapes, \u00XX for other controls), less Go's HTML
    # and line-separator escapes, added after: a per-character loop costs ~50 ns a character.
    text = _encode_string(s)
    for ch in _GO_ONLY:
        if ch in text:
            text = text.replace(ch, _ESCAPES[ch])
    return text


_GO_ONLY = "<>&\u2028\u2029"


def _float(f: float) -> str:
    if math.isnan(f) or math.isinf(f):
        raise ValueError("model request holds a non-finite number")
    if f == 0:
        return "-0" if math.copysign(1.0, f) < 0 else "0"
    a = abs(f)
    if 1e-6 <= a < 1e21:
        text = format(Decimal(repr(f)), "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return text
    text = repr(f)
    mantissa, _, exponent = text.partition("e")
    sign = exponent[0] if exponent[0] in "+-" else "+"
    digits = exponent.lstrip("+-").lstrip("0") or "0"
    if len(digits) == 1 and sign == "+":
        digits = "0" + digits  # Go keeps two exponent digits for e+XX, trims e-0X to e-X
    return f"{mantissa}e{sign}{digits}"


def _bytes(b: bytes | None) -> str:
    return "null" if b is None else '"' + base64.b64encode(b).decode("ascii") + '"'


def _value(v: struct_pb2.Value) -> str:
    kind = v.WhichOneof("kind")
    if kind == "number_value":
        return _float(v.number_value)
    if kind == "string_value":
        return _str(v.string_value)
    if kind == "bool_value":
        return "true" if v.bool_value else "false"
    if kind == "struct_value":
        return _map(v.struct_value)
    if kind == "list_value":
        return "[" + ",".join(_value(x) for x in v.list_value.values) + "]"
    return "null"


def _map(s: struct_pb2.Struct) -> str:
    return "{" + ",".join(f"{_str(k)}:{_value(s.fields[k])}" for k in sorted(s.fields)) + "}"


def _opt_struct(owner: object, field: str) -> str:
    if not owner.HasField(field):  # type: ignore[attr-defined]
        return "null"
    return _map(getattr(owner, field))


def _obj(pairs: list[tuple[str, str]]) -> str:
    return "{" + ",".join(f'"{k}":{v}' for k, v in pairs) + "}"


def _enum_name(full: str, prefix: str) -> str:
    return "" if full.endswith("_UNSPECIFIED") else full.removeprefix(prefix)


def _tool_call(c: common_pb2.ToolCall) -> str:
    mediation = _enum_name(common_pb2.Mediation.Name(c.mediation), "MEDIATION_")
    return _obj(
        [
            ("ID", _str(c.id)),
            ("Tool", _str(c.tool)),
            ("Args", _opt_struct(c, "args")),
            ("Mediation", _str(mediation)),
            ("IdempotencyKey", _str(c.idempotency_key)),
        ]
    )


def _tool_result(r: common_pb2.ToolResult) -> str:
    pairs = [
        ("ID", _str(r.id)),
        ("Output", _opt_struct(r, "output")),
        ("OutputURI", _str(r.output_uri)),
        ("OutputDigest", _str(r.output_digest)),
        ("IsError", "true" if r.is_error else "false"),
        ("Error", _str(r.error)),
    ]
    if r.content:
        pairs.append(("Content", "[" + ",".join(_part(p) for p in r.content) + "]"))
    if r.code:
        pairs.append(("Code", _str(common_pb2.ToolResult.Code.Name(r.code))))
    if r.approval_request_seq:
        pairs.append(("ApprovalRequestSeq", str(r.approval_request_seq)))
    if r.approval_decision_seq:
        pairs.append(("ApprovalDecisionSeq", str(r.approval_decision_seq)))
    return _obj(pairs)


def _part(p: common_pb2.Part) -> str:
    kind = p.WhichOneof("part")
    text = file = data = reasoning = "null"
    if kind == "text":
        text = _obj([("Text", _str(p.text.text))])
    elif kind == "file":
        f = p.file
        file = _obj(
            [
                ("MIME", _str(f.mime)),
                ("Bytes", _bytes(f.bytes if f.WhichOneof("source") == "bytes" and f.bytes else None)),
                ("URI", _str(f.uri)),
                ("Digest", _str(f.digest)),
                ("Name", _str(f.name)),
            ]
        )
    elif kind == "data":
        data = _opt_struct(p.data, "data")
    elif kind == "reasoning":
        r = p.reasoning
        opaque = r.opaque_bytes if r.WhichOneof("opaque") == "opaque_bytes" and r.opaque_bytes else None
        summary = "[" + ",".join(_part(x) for x in r.summary) + "]" if r.summary else "null"
        reasoning = _obj(
            [
                ("Provider", _str(r.provider)),
                ("ModelID", _str(r.model_id)),
                ("Opaque", _bytes(opaque)),
                ("OpaqueURI", _str(r.opaque_uri)),
                ("OpaqueDigest", _str(r.opaque_digest)),
                ("Summary", summary),
                ("ItemID", _str(r.item_id)),
                ("Ordinal", str(r.ordinal)),
                ("ValidityScope", _str(r.validity_scope)),
            ]
        )
    pairs = [("Text", text), ("File", file), ("Data", data), ("Reasoning", reasoning)]
    if kind == "tool_call":
        pairs.append(("ToolCall", _tool_call(p.tool_call)))
    elif kind == "tool_result":
        pairs.append(("ToolResult", _tool_result(p.tool_result)))
    return _obj(pairs)


def _message(m: common_pb2.Message) -> str:
    parts = "[" + ",".join(_part(p) for p in m.parts) + "]" if m.parts else "null"
    return _obj([("Role", _str(m.role)), ("Parts", parts)])


def encode_model_request(call: common_pb2.ModelCall) -> bytes:
    """The Go-compatible JSON encoding of the request a wire ModelCall carries."""
    messages = "[" + ",".join(_message(m) for m in call.messages) + "]" if call.messages else "null"
    params = (
        "{" + ",".join(f"{_str(k)}:{_str(call.params[k])}" for k in sorted(call.params)) + "}"
        if call.params
        else "null"
    )
    pairs = [("Model", _str(call.model)), ("Messages", messages), ("Params", params)]
    if call.tools:
        tools = []
        for t in call.tools:
            tools.append(
                _obj(
                    [
                        ("Name", _str(t.name)),
                        ("Description", _str(t.description)),
                        ("InputSchema", _opt_struct(t, "input_schema")),
                    ]
                )
            )
        pairs.append(("Tools", "[" + ",".join(tools) + "]"))
    if call.HasField("tool_choice"):
        mode = _enum_name(common_pb2.ToolChoice.Mode.Name(call.tool_choice.mode), "MODE_")
        pairs.append(("ToolChoice", _obj([("Mode", _str(mode)), ("Name", _str(call.tool_choice.name))])))
    return _obj(pairs).encode("utf-8")


def model_input_hash(call: common_pb2.ModelCall) -> str:
    """Lowercase hex SHA-256 of :func:`encode_model_request`."""
    return hashlib.sha256(encode_model_request(call)).hexdigest()
