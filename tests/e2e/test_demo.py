"""``make demo`` runs its walkthrough against an embedded host and verifies the chain."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def test_demo_walkthrough_runs_and_verifies() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agentsessions.host.demo"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "'echo:hi'" in out and "'echo:durable agents'" in out
    assert "chain of 10 records verifies from genesis" in out
    assert "MISMATCH" not in out
    assert "child shares the parent's first 5 records" in out
