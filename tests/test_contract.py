"""The contract files: buf lint, wire compatibility with agentsessions.v1, and no drift between the
protos and the committed generated code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GENERATED = ROOT / "sdk" / "src" / "agentsessions" / "v1"
CHECK_WIRE = ROOT.parent / "shared" / "tools" / "check_wire.py"
TIMEOUT = 300


def test_buf_lint_passes() -> None:
    linted = subprocess.run(
        [str(BIN / "buf"), "lint"], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_protos_carry_the_wire_contract() -> None:
    if not CHECK_WIRE.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHECK_WIRE} is missing")
        pytest.skip(f"{CHECK_WIRE} is not beside this checkout")
    checked = subprocess.run(
        [sys.executable, str(CHECK_WIRE), "--proto-root", "proto"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "wire contract: 0 incompatibilities" in checked.stdout


def generated_files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.glob("*_pb2*")) if path.is_file()}


def test_generated_code_matches_the_protos(tmp_path: Path) -> None:
    """Regenerate with the Makefile's own ``proto`` recipe into a scratch directory and compare bytes."""
    venv = BIN.parent
    regenerated = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-s",
            # The tools are installed already; never let this test start an install.
            "-o",
            f"{venv}/.installed",
            "proto",
            f"VENV={venv}",
            f"GEN_DIR={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert regenerated.returncode == 0, regenerated.stdout + regenerated.stderr

    fresh = generated_files(tmp_path / "agentsessions" / "v1")
    committed = generated_files(GENERATED)
    assert fresh, "make proto generated nothing"
    assert sorted(fresh) == sorted(committed), "generated file set differs: run make proto and commit"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"committed generated code is stale: {stale}; run make proto and commit"
