"""The contract files: buf lint, wire compatibility with the committed agentsessions.v1 baseline
(contract/), and no drift between the protos and the committed generated code.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GENERATED = ROOT / "sdk" / "src"
PACKAGES = (("agentsessions", "v1"), ("agentsessions", "ext", "v1"))
BASELINE = ROOT / "contract" / "agentsessions-v1.binpb"
TIMEOUT = 300


def test_buf_lint_passes() -> None:
    linted = subprocess.run(
        [str(BIN / "buf"), "lint"], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr


def buf_breaking(workspace: Path) -> subprocess.CompletedProcess[str]:
    """``buf breaking`` of the buf workspace at ``workspace`` against the committed v1 baseline image."""
    return subprocess.run(
        [str(BIN / "buf"), "breaking", "--against", str(BASELINE)],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def test_protos_carry_the_wire_contract() -> None:
    """Nothing in proto/ breaks the v1 wire baseline (numbers, types, JSON names, enum values, RPCs)."""
    checked = buf_breaking(ROOT)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_baseline_covers_every_v1_file() -> None:
    image = descriptor_pb2.FileDescriptorSet()
    image.ParseFromString(BASELINE.read_bytes())
    in_image = {f.name for f in image.file if f.name.startswith("agentsessions/v1/")}
    on_disk = {
        str(path.relative_to(ROOT / "proto"))
        for path in (ROOT / "proto" / "agentsessions" / "v1").glob("*.proto")
    }
    assert in_image == on_disk


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("int64 resume_from_seq = 3;", "int64 resume_from_seq = 30;"), "resume_from_seq"),
        (("int64 resume_from_seq = 3;", "int32 resume_from_seq = 3;"), "resume_from_seq"),
    ],
    ids=["renumbered field", "retyped field"],
)
def test_a_wire_break_is_caught(tmp_path: Path, edit: tuple[str, str], expected: str) -> None:
    """The check can fail: the same protos with one field of session.proto changed are refused."""
    shutil.copytree(ROOT / "proto", tmp_path / "proto")
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    session = tmp_path / "proto" / "agentsessions" / "v1" / "session.proto"
    text = session.read_text()
    assert edit[0] in text
    session.write_text(text.replace(edit[0], edit[1], 1))
    checked = buf_breaking(tmp_path)
    assert checked.returncode != 0
    assert expected in checked.stdout + checked.stderr


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

    for package in PACKAGES:
        fresh = generated_files(tmp_path.joinpath(*package))
        committed = generated_files(GENERATED.joinpath(*package))
        name = ".".join(package)
        assert fresh, f"make proto generated nothing for {name}"
        assert sorted(fresh) == sorted(committed), f"{name}: generated file set differs: run make proto"
        stale = [file for file in fresh if fresh[file] != committed[file]]
        assert not stale, f"{name}: committed generated code is stale: {stale}; run make proto and commit"
