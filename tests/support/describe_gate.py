"""A gate on a harness process's ``Describe``: how a crash test stops a real host at a point inside
the host, with nothing but the harness it talks to.

The host Describes a harness before it drives an execution (a new turn, a re-drive, a corrective
turn), and with ``--harness-describe-max-age 0`` every one of those is a ``Describe`` call. While
the file :data:`HOLD` exists in the harness process's working directory (``HarnessProcess`` runs
it in its log directory), a ``Describe`` adds a line to :data:`HELD` there and waits until the
file is gone (bounded), so the host stands provably at that point: whatever it wrote before is
durable, nothing after it has happened. A test kills the host there, removes :data:`HOLD` and
starts the host again.

:class:`GatedChat` is the chat harness with the gate, which also arms it itself: when its first
turn ends and the file :data:`ARM` exists, it renames :data:`ARM` to :data:`HOLD`, so the next
Describe (the one the host makes for whatever it drives next) is held.
Served with ``agentsessions-harness serve tests.support.describe_gate:GatedChat``.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from agentsessions.harnesses.chat import ChatHarness
from agentsessions.sdk import Execution
from agentsessions.v1 import harness_pb2

HOLD = "hold-describe"
HELD = "describe-held"
ARM = "arm-describe-hold"
HOLD_LIMIT_S = 60.0
POLL_S = 0.02


async def hold_while_asked(where: Path | None = None) -> None:
    """Wait (bounded) while ``where/HOLD`` exists, announcing it as a line in ``where/HELD``."""
    here = where if where is not None else Path.cwd()
    if not (here / HOLD).exists():
        return
    with (here / HELD).open("a") as held:
        held.write("describe\n")
    with contextlib.suppress(TimeoutError):  # a test that never lets go still ends
        async with asyncio.timeout(HOLD_LIMIT_S):
            # Polled: the file is removed by another process.
            while (here / HOLD).exists():  # noqa: ASYNC110
                await asyncio.sleep(POLL_S)


def held(where: Path) -> int:
    """How many Describes stood at the gate so far."""
    path = where / HELD
    return len(path.read_text().splitlines()) if path.exists() else 0


class GatedChat(ChatHarness):
    """The chat harness whose Describe waits at the gate; its first turn arms the gate (module doc)."""

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        await hold_while_asked()
        return await super().describe()

    async def execute(self, ex: Execution) -> None:
        await super().execute(ex)
        with contextlib.suppress(FileNotFoundError):  # armed once: only the first turn holds the next
            Path.cwd().joinpath(ARM).rename(Path.cwd() / HOLD)
