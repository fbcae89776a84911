"""``make demo``'s second part: the coding agent parks before writing, the demo approves, Resume
writes the file through the host-side executor, and replay changes nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def test_coding_demo_asks_before_writing_and_replays_identically() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agentsessions.host.demo", "--coding"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "chain of 10 records" not in out, "--coding runs only the coding part"
    lines = [line.strip() for line in out.splitlines()]
    assert any(
        line.startswith("#5") and "TOOL_CALL" in line and "REQUIRES_APPROVAL" in line for line in lines
    )
    assert any(line.startswith("#6") and "APPROVAL_REQUEST" in line for line in lines)
    assert "parked: EXEC_AWAITING" in out
    assert "hello.py exists before approval: False" in out
    assert "approve -> decision at seq 8" in out
    assert "resume -> EXEC_COMPLETED" in out
    assert any("TOOL_RESULT" in line and "ok (request #6, decision #8)" in line for line in lines)
    assert "hello.py exists after approval: True" in out
    assert "chain of 13 records verifies from genesis" in out
    assert (
        "controller replay: 1 execution, 2 model calls served from the journal, 0 sent to the model, "
        "hello.py untouched, journal byte-identical"
    ) in out
