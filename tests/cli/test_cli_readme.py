"""The README's CLI quickstart block runs as written against a live host."""

from __future__ import annotations

import asyncio
import re
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.host_process import BIN, HostProcess, repo_env
from tests.support.readme import ROOT, readme_block

pytestmark = pytest.mark.e2e


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[str]:
    process = HostProcess(tmp_path / "journal.db", tmp_path)
    await process.start()
    try:
        yield process.address
    finally:
        await process.close()


async def test_the_cli_quickstart_runs_as_written(host: str) -> None:
    script = readme_block("cli-quickstart", "sh")
    assert "AGENTSESSIONS_SERVER=127.0.0.1:50051" in script and "A=.venv/bin/agentsessions" in script
    script = script.replace("127.0.0.1:50051", host).replace(
        "A=.venv/bin/agentsessions", f"A={BIN}/agentsessions"
    )
    environ = {k: v for k, v in repo_env().items() if not k.startswith("AGENTSESSIONS_")}
    shell = await asyncio.create_subprocess_exec(
        "bash", "-euo", "pipefail", "-c", script, stdout=PIPE, stderr=PIPE, cwd=ROOT, env=environ
    )
    async with asyncio.timeout(120):
        raw_out, raw_err = await shell.communicate()
    stdout = raw_out.decode()
    assert shell.returncode == 0, stdout + raw_err.decode()
    out = stdout.splitlines()
    assert out[0] == f"{host}: SERVING"
    assert out[1:5] == ["> hi", "echo:hi", "> bye", "echo:bye"]
    assert "state        COMPLETED (compute LIVE)" in out and "labels       team=docs" in out
    assert "last seq     10" in out
    assert [line for line in out if "different second turn" in line] == [
        "> a different second turn",
        "echo:a different second turn",
    ]
    verified = [line for line in out if line.startswith("ok: session ")]
    assert len(verified) == 2
    assert "chain of 10 records" in verified[0] and "chain of 11 records" in verified[1]  # + the FORK marker
    assert any(re.fullmatch(r"sess-\w+ exec=COMPLETED compute=COLD last_seq=11", line) for line in out)
    listed = [line.split()[-1] for line in out if re.match(r"sess-\w+ +COMPLETED", line)]
    assert listed[:2] == ["left", "quickstart"]
