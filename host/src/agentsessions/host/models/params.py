"""``ModelCall.params`` (a string map on the wire) as typed chat-completions request fields.

Known parameters get their type: ``temperature``, ``top_p``, ``presence_penalty`` and
``frequency_penalty`` are numbers; ``max_tokens``, ``max_completion_tokens``, ``seed``, ``n`` and
``top_logprobs`` integers; ``logprobs``, ``parallel_tool_calls`` and ``store`` booleans (``true`` or
``false``); ``response_format``, ``logit_bias`` and ``metadata`` JSON objects; ``stop`` a string, or
a JSON list of strings. Any other parameter is sent as the JSON value its text spells (``2``,
``true``, ``{"k": 1}``), else as the string itself, so provider-specific options pass through.
The fields the host sets itself (``model``, ``messages``, ``tools``, ``tool_choice``, ``stream``,
``stream_options``) cannot be overridden. A value of the wrong type fails the call with a
ModelError naming the parameter, before anything is sent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from agentsessions.host.models.provider import ModelError

_NUMBERS = frozenset({"temperature", "top_p", "presence_penalty", "frequency_penalty"})
_INTEGERS = frozenset({"max_tokens", "max_completion_tokens", "seed", "n", "top_logprobs"})
_BOOLEANS = frozenset({"logprobs", "parallel_tool_calls", "store"})
_OBJECTS = frozenset({"response_format", "logit_bias", "metadata"})
HOST_FIELDS = frozenset({"model", "messages", "tools", "tool_choice", "stream", "stream_options"})


def request_params(params: Mapping[str, str]) -> dict[str, Any]:
    """The request fields for ``params``, in key order (deterministic request bodies)."""
    return {key: _value(key, params[key]) for key in sorted(params)}


def _value(key: str, text: str) -> Any:
    if key in HOST_FIELDS:
        raise ModelError(f"params.{key}: set by the host, not a parameter")
    if key in _NUMBERS:
        try:
            number = float(text)
        except ValueError:
            raise ModelError(f"params.{key}: {text!r} is not a number") from None
        if not math.isfinite(number):
            raise ModelError(f"params.{key}: {text!r} is not a finite number")
        return number
    if key in _INTEGERS:
        try:
            return int(text)
        except ValueError:
            raise ModelError(f"params.{key}: {text!r} is not an integer") from None
    if key in _BOOLEANS:
        if text not in ("true", "false"):
            raise ModelError(f"params.{key}: {text!r} is not true or false")
        return text == "true"
    if key in _OBJECTS:
        decoded = _json(text)
        if not isinstance(decoded, dict):
            raise ModelError(f"params.{key}: {text!r} is not a JSON object")
        return decoded
    if key == "stop":
        decoded = _json(text) if text.lstrip().startswith("[") else text
        if isinstance(decoded, list) and all(isinstance(item, str) for item in decoded):
            return decoded
        if isinstance(decoded, str):
            return decoded
        raise ModelError(f"params.stop: {text!r} is neither a string nor a JSON list of strings")
    decoded = _json(text)
    return text if decoded is _NOT_JSON else decoded


_NOT_JSON: Any = object()


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity are not valid request values


def _json(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_no_constants)
    except ValueError:
        return _NOT_JSON
