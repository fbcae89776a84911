"""The README's blocks run as written: the grpcurl quickstart, the Python client, the harness."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentsessions.client import SessionsClient
from agentsessions.v1 import common_pb2
from tests.support.host_process import HostProcess
from tests.support.processes import BIN, harness_process
from tests.support.readme import ROOT, readme_block

pytestmark = pytest.mark.e2e


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


def run_against(host: str, script: str) -> str:
    """Run a README shell block as written, against ``host`` and this checkout's tools; its stdout."""
    script = script.replace("HOST=127.0.0.1:50051", f"HOST={host}")
    script = script.replace('G=".venv/bin/grpcurl', f'G="{BIN}/grpcurl').replace(
        "python3 -c", f"{sys.executable} -c"
    )
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    return out


def test_quickstart_runs_against_a_live_host(host: str) -> None:
    out = run_against(host, readme_block("quickstart", "sh"))
    assert '"text": "echo:hi"' in out and '"text": "echo:bye"' in out
    assert out.count('"kind": "EVENT_END"') >= 4  # two Exec streams + Replay of both turns
    assert '"name": "left"' in out and '"name": "right"' in out
    assert '"computeState": "COMPUTE_COLD"' in out or '"compute_state": "COMPUTE_COLD"' in out


def test_the_python_client_block_runs_as_written(host: str, tmp_path: Path) -> None:
    script = readme_block("client", "python").replace("127.0.0.1:50051", host)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "1 EVENT_EXECUTION_START ",
        "2 EVENT_INPUT hi",
        "3 EVENT_MODEL_CALL ",
        "4 EVENT_OUTPUT echo:hi",
        "5 EVENT_END ",
    ]


def serve_command() -> list[str]:
    """The README's ``agentsessions-harness serve ...`` command for its harness file, on a free port."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"Serve it with `(agentsessions-harness serve [^`]+)`", readme)
    assert found, "README lost its harness serve command"
    argv = shlex.split(found.group(1).replace("127.0.0.1:50061", "127.0.0.1:0"))
    return [str(BIN / argv[0]), *argv[1:]]


async def test_the_harness_block_serves_as_written_from_its_folder(tmp_path: Path) -> None:
    """The README's harness file, served by the README's command run in the file's own folder."""
    folder = tmp_path / "mine"
    folder.mkdir()
    block = readme_block("harness", "python")
    name = re.match(r"# (\w+\.py)\n", block)
    assert name, "the README's harness block starts with its file name"
    (folder / name.group(1)).write_text(block)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    async with harness_process(serve_command(), cwd=folder, env=env) as harness:
        host = HostProcess(tmp_path / "j.db", tmp_path, ["--harness", f"mine={harness.address}"])
        await host.start()
        try:
            async with SessionsClient.connect(host.address) as client:
                session = await client.create_session(harness="mine")
                records = [
                    update.record
                    async for update in client.exec(session.metadata.uid, "hi")
                    if update.WhichOneof("update") == "record"
                ]
        finally:
            await host.close()
    kinds = [common_pb2.EventKind.Name(record.event.kind) for record in records]
    assert kinds == ["EVENT_EXECUTION_START", "EVENT_INPUT", "EVENT_MODEL_CALL", "EVENT_OUTPUT", "EVENT_END"]
    assert records[3].event.message.parts[0].text.text == "echo:hi"


def test_the_live_sessions_block_runs_as_written(host: str) -> None:
    out = run_against(host, readme_block("live", "sh"))
    # The keyed Exec twice: the same five records, hashes included.
    hashes = re.findall(r'"content_?[hH]ash": "([0-9a-f]+)"', out)
    assert len(hashes) >= 12 and hashes[:5] == hashes[5:10]
    assert out.count('"text": "echo:hi"') == 2 + 1  # both Exec streams, then the Watch's OUTPUT
    submits = re.findall(r'"execution_?[iI]d": "([0-9a-f]+)",\s*"start_?[sS]eq": "(\d+)"', out)
    assert len(submits) >= 2 and submits[0] == submits[1] and submits[0][1] == "6"


def test_the_live_python_client_block_runs_as_written(host: str) -> None:
    script = readme_block("live-client", "python").replace("127.0.0.1:50051", host)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "1 EVENT_EXECUTION_START",
        "2 EVENT_INPUT",
        "3 EVENT_MODEL_CALL",
        "4 EVENT_OUTPUT",
        "5 EVENT_END",
    ]
