"""Where the confinement tests find bubblewrap: skipped without it locally, failed in CI."""

from __future__ import annotations

import os

import pytest

from agentsessions.host.tools import Bubblewrap


async def bwrap_or_skip() -> str:
    """The bubblewrap on PATH, once the host's own probe says it confines here; otherwise the test
    skips, or fails when ``CI`` is set (.ci/run installs Debian's bubblewrap, so CI always
    confines for real)."""
    bubblewrap = Bubblewrap()
    status = await bubblewrap.probe()
    if not status.confined:
        message = f"cannot confine here ({status.detail}): apt-get install -y bubblewrap"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI is set, so confinement must be tested")
        pytest.skip(message)
    return bubblewrap.binary
