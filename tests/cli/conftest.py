"""Fixtures of the CLI tests: the ``agentsessions`` command run as a real process."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from tests.support.host_process import BIN, repo_env

CLI_LIMIT_S = 60.0
# Variables of the caller's shell that would change what a command reaches.
_CLIENT_VARIABLES = ("AGENTSESSIONS_SERVER", "AGENTSESSIONS_TOKEN", "AGENTSESSIONS_PROGRESS")


@dataclass(frozen=True)
class Done:
    code: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout\n{self.out}--- stderr\n{self.err}"


async def cli(*args: str, server: str = "", env: Mapping[str, str] | None = None, stdin: str = "") -> Done:
    """Run ``agentsessions ARGS`` to completion (bounded); ``server`` goes in AGENTSESSIONS_SERVER."""
    environ = {k: v for k, v in repo_env().items() if k not in _CLIENT_VARIABLES}
    environ.update(env or {})
    if server:
        environ["AGENTSESSIONS_SERVER"] = server
    process = await asyncio.create_subprocess_exec(
        str(BIN / "agentsessions"),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=environ,
    )
    try:
        async with asyncio.timeout(CLI_LIMIT_S):
            out, err = await process.communicate(stdin.encode())
    except TimeoutError:
        process.kill()
        await process.wait()
        raise AssertionError(
            f"agentsessions {' '.join(args)} did not finish within {CLI_LIMIT_S} s"
        ) from None
    assert process.returncode is not None
    return Done(process.returncode, out.decode(), err.decode())
