"""A suite's results file (``bench/results/<suite>.json``): the machine it ran on, and the JSON
document written out, so every suite records the same facts in the same form."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

__all__ = ["machine", "pace", "pace_line", "write"]

PACE_REPEATS: Final = 7


def machine(**extra: Any) -> dict[str, Any]:
    """The Python, the platform and the CPU count of this run (plus whatever a suite adds)."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        **extra,
    }


def pace(repeats: int = PACE_REPEATS) -> float:
    """Milliseconds this machine takes for a fixed piece of work of the kind a host does (Python
    calls and dicts, protobuf encoding and decoding, SHA-256, JSON), the best of ``repeats``.

    A suite measures it when it starts and when it ends. On a shared or virtual machine the same
    code on the same load can cost a third more CPU for minutes at a time; a pace that moved
    between two runs, or within one, says the machine did, where a ratio alone cannot."""
    from agentsessions.v1 import common_pb2

    text = common_pb2.Part(text=common_pb2.TextPart(text="a reference turn's input " * 4))
    event = common_pb2.Event(
        execution_id="e" * 16,
        kind=common_pb2.EVENT_INPUT,
        message=common_pb2.Message(role="user", parts=[text]),
    )
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        table: dict[str, int] = {}
        for i in range(2_000):
            record = common_pb2.LogRecord(seq=i, prev_hash="0" * 64, content_hash="1" * 64, fence=1)
            record.event.CopyFrom(event)
            blob = record.SerializeToString()
            common_pb2.LogRecord.FromString(blob)
            digest = hashlib.sha256(blob).hexdigest()
            table[digest[:8]] = table.get(digest[:8], 0) + len(json.dumps({"seq": i, "hash": digest}))
            for j in range(10):
                _step(table, j)
        best = min(best, time.perf_counter() - began)
    return best * 1000


def pace_line(pace: Mapping[str, float]) -> str:
    """The pace figures of a run, as its report prints them."""
    shown = ", ".join(f"{when.removesuffix('_ms')} {ms:.1f} ms" for when, ms in pace.items())
    return f"machine pace (a fixed piece of work, best of {PACE_REPEATS}; lower is faster): {shown}"


def _step(table: dict[str, int], j: int) -> int:
    return table.setdefault(str(j), j)


def write(out: Path, document: Mapping[str, Any], *, sort_keys: bool = True) -> None:
    """``document`` as indented JSON at ``out``, its folder created if need be."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2, sort_keys=sort_keys) + "\n")
