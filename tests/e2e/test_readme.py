"""The README's Sessions quickstart block runs as written against a live host."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import BIN

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def quickstart_script() -> str:
    readme = (ROOT / "README.md").read_text()
    block = re.search(
        r"<!-- quickstart:begin.*?-->\s*```sh\n(.*?)```\s*<!-- quickstart:end -->", readme, re.S
    )
    assert block, "README lost its quickstart block"
    return block.group(1)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[str]:
    proc = subprocess.Popen(
        [str(BIN / "agentsessions"), "serve", "--listen", "127.0.0.1:0", "--journal", str(tmp_path / "j.db")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        address = ""
        for line in proc.stdout:
            found = re.search(r"serving listen=(\S+)", line)
            if found:
                address = found.group(1)
                break
        assert address, "host did not report its address"
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_quickstart_runs_against_a_live_host(host: str) -> None:
    script = quickstart_script().replace("HOST=127.0.0.1:50051", f"HOST={host}")
    script = script.replace('G=".venv/bin/grpcurl', f'G="{BIN}/grpcurl').replace(
        "python3 -c", f"{sys.executable} -c"
    )
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert '"text": "echo:hi"' in out and '"text": "echo:bye"' in out
    assert out.count('"kind": "EVENT_END"') >= 4  # two Exec streams + Replay of both turns
    assert '"name": "left"' in out and '"name": "right"' in out
    assert '"computeState": "COMPUTE_COLD"' in out or '"compute_state": "COMPUTE_COLD"' in out
