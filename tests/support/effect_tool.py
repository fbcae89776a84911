"""A host-run tool whose effect can be counted, for crash tests:
``--tool-executor python:tests.support.effect_tool:record_effect`` (the host needs the repo root on
PYTHONPATH).

Arguments: ``{"dir": <control directory>, "hold": <bool>, "note": <text>}``. Every invocation
appends one line to ``dir/tool-attempts.jsonl``; the effect is one line in ``dir/tool-effects.jsonl``
naming the call's idempotency key, so a key written twice is a duplicated effect. The tool does not
deduplicate on its own: whatever the host re-runs shows. With ``hold`` set and no ``dir/release``
marker, the call announces itself in ``dir/tool-entered`` and waits for the marker before its
effect: a host killed then is killed during the tool call, with nothing done yet.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from agentsessions.host.tools.executor import ToolContext

ATTEMPTS = "tool-attempts.jsonl"
EFFECTS = "tool-effects.jsonl"
ENTERED = "tool-entered"
RELEASE = "release"

# A held call gives up after this long, so a test that never releases it still ends.
HOLD_LIMIT_S = 60.0
POLL_S = 0.02


def append_line(path: Path, entry: dict[str, Any]) -> None:
    """One JSON line, written with a single O_APPEND write (whole lines even across processes)."""
    data = (json.dumps(entry, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def record_effect(args: dict[str, Any], context: ToolContext) -> str:
    """Record one effect under the call's idempotency key."""
    control = Path(str(args["dir"]))
    entry = {"key": context.idempotency_key, "call": context.call_id, "pid": os.getpid()}
    append_line(control / ATTEMPTS, entry)
    if args.get("hold") and not (control / RELEASE).exists():
        append_line(control / ENTERED, entry)
        deadline = time.monotonic() + HOLD_LIMIT_S
        while not (control / RELEASE).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {RELEASE} marker in {control} within {HOLD_LIMIT_S} s")
            time.sleep(POLL_S)
    append_line(control / EFFECTS, entry)
    return f"recorded {context.idempotency_key} ({args.get('note', '')})"
