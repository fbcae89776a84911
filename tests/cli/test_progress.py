"""Progress bars are drawn on a terminal and nowhere else.

The commands run as real processes with stderr on a pseudo-terminal (what a person's shell gives
them) or on a pipe (what scripts and CI give them); the bar's description is looked for in what
reached stderr.
"""

from __future__ import annotations

import os
import pty
import subprocess
from pathlib import Path

import pytest

from tests.fixtures import GO_JOURNALS
from tests.support.host_process import BIN, repo_env

pytestmark = pytest.mark.e2e


def run_on(terminal: bool, *args: str, **env: str) -> tuple[int, str, str]:
    """``agentsessions ARGS`` with stderr on a pseudo-terminal or a pipe: (exit, stdout, stderr)."""
    environ = {k: v for k, v in repo_env().items() if k != "AGENTSESSIONS_PROGRESS"}
    environ.update(TERM="xterm-256color", COLUMNS="120", **env)
    argv = [str(BIN / "agentsessions"), *args]
    if not terminal:
        done = subprocess.run(argv, capture_output=True, text=True, env=environ, timeout=120)
        return done.returncode, done.stdout, done.stderr
    controller, terminal_end = pty.openpty()
    try:
        done = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=terminal_end, text=True, env=environ, timeout=120
        )
    finally:
        os.close(terminal_end)
    seen = b""
    try:
        while chunk := os.read(controller, 65536):
            seen += chunk
    except OSError:
        pass  # EIO: the terminal's other end is closed and everything was read
    finally:
        os.close(controller)
    return done.returncode, done.stdout, seen.decode(errors="replace")


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    path = tmp_path / "journal.db"
    for fixture in ("completed.json", "multi-turn.json"):
        code, _, err = run_on(False, "journal", "import", "--journal", str(path), str(GO_JOURNALS / fixture))
        assert code == 0, err
    return path


@pytest.mark.parametrize(
    ("command", "description"),
    [
        (["journal", "verify"], "verifying"),
        (["journal", "export", "--force", "--out"], "exporting"),
    ],
)
def test_a_bar_is_drawn_only_on_a_terminal(
    journal: Path, tmp_path: Path, command: list[str], description: str
) -> None:
    args = [*command, str(tmp_path / "out.db")] if "--out" in command else command
    args = [*args[:2], "--journal", str(journal), *args[2:]]
    code, out, shown = run_on(True, *args)
    assert code == 0 and out.startswith("ok: "), (out, shown)
    assert description in shown and "sessions" in shown, shown
    code, out, piped = run_on(False, *args)
    assert code == 0 and out.startswith("ok: ")
    assert piped == "", "no bar, and nothing else, on a pipe"


def test_bars_can_be_switched_off_on_a_terminal(journal: Path) -> None:
    code, out, shown = run_on(
        True, "journal", "verify", "--journal", str(journal), AGENTSESSIONS_PROGRESS="off"
    )
    assert code == 0 and out.startswith("ok: 2 sessions")
    assert "verifying" not in shown


def test_import_shows_its_bar_on_a_terminal(tmp_path: Path) -> None:
    fixture = GO_JOURNALS / "multi-turn.json"
    code, out, shown = run_on(True, "journal", "import", "--journal", str(tmp_path / "j.db"), str(fixture))
    assert code == 0 and out.startswith("ok: imported"), shown
    assert "records" in shown and ("importing" in shown or "storing" in shown), shown
