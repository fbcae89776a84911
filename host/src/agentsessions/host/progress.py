"""Progress bars for long command-line work (``journal verify|export|import``, ``replay``, ``verify``).

A bar is drawn on stderr with rich only when stderr is a terminal, so pipes, log files and CI output
never see one; ``AGENTSESSIONS_PROGRESS=off`` turns bars off on a terminal too. The bar is transient:
it is erased when the work ends, leaving the command's own result lines.

    with progress("verifying", total=len(uids), unit="sessions") as bar:
        for uid in uids:
            ...
            bar.advance()
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

__all__ = ["Bar", "enabled", "progress"]

SWITCH_ENV = "AGENTSESSIONS_PROGRESS"


class Bar(Protocol):
    """What the work reports to its bar."""

    def advance(self, steps: int = 1) -> None: ...

    def update(self, *, total: int | None = None, description: str | None = None) -> None: ...


class _Hidden:
    """The bar when none is drawn: every report is dropped."""

    def advance(self, steps: int = 1) -> None:
        return None

    def update(self, *, total: int | None = None, description: str | None = None) -> None:
        return None


class _Drawn:
    def __init__(self, bars: Progress, task: TaskID) -> None:
        self._bars = bars
        self._task = task

    def advance(self, steps: int = 1) -> None:
        self._bars.advance(self._task, steps)

    def update(self, *, total: int | None = None, description: str | None = None) -> None:
        if total is not None:
            self._bars.update(self._task, total=total)
        if description is not None:
            self._bars.update(self._task, description=description)


def enabled() -> bool:
    """True when a bar would be drawn: stderr is a terminal and bars are not switched off."""
    if os.environ.get(SWITCH_ENV, "").lower() in ("0", "off", "false", "no"):
        return False
    return sys.stderr.isatty()


@contextmanager
def progress(description: str, *, total: int | None = None, unit: str = "") -> Iterator[Bar]:
    """A bar for one piece of work; ``total=None`` draws a spinner with a running count."""
    if not enabled():
        yield _Hidden()
        return
    # rich loads only when a bar is drawn (every `agentsessions` command imports this module).
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = [
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=Console(stderr=True), transient=True) as bars:
        yield _Drawn(bars, bars.add_task(description, total=total))
