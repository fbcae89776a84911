"""Where the confinement tests find bubblewrap: skipped without it locally, failed in CI."""

from __future__ import annotations

import os
import shutil

import pytest


def bwrap_or_skip() -> str:
    """The bubblewrap binary on PATH; without one the test skips, or fails when ``CI`` is set
    (.ci/run installs Debian's bubblewrap, so CI always confines for real)."""
    found = shutil.which("bwrap")
    if found is None:
        message = "bubblewrap (bwrap) is not installed: apt-get install -y bubblewrap"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI is set, so confinement must be tested)")
        pytest.skip(message)
    return found
