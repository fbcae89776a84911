"""Fixtures of the console's browser tests: Debian's chromium driven by selenium through
chromedriver, on loopback, and where the screenshots go.

Without a browser the tests skip; with ``CI`` set they fail instead, so CI cannot pass without
having run them (``.ci/run`` installs chromium and chromium-driver first). Screenshots go to
``$AGENTSESSIONS_SCREENSHOTS``, else ``var/screenshots/`` in the repository (ignored by git).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = ("/usr/bin/chromium", "chromium")
CHROMEDRIVER = ("/usr/bin/chromedriver", "chromedriver")
# The flags chromium needs on these machines (MACHINE-NOTES): no sandbox as root, no GPU, and none
# of its own background connections, which the closed network would refuse.
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,1000",
)


def _find(candidates: tuple[str, ...]) -> str | None:
    for candidate in candidates:
        found = shutil.which(candidate)
        if found:
            return found
    return None


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the console's browser tests need chromium under CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def screenshots() -> Path:
    folder = Path(os.environ.get("AGENTSESSIONS_SCREENSHOTS") or ROOT / "var" / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    """A headless chromium under selenium, with a profile of its own in ``tmp_path``."""
    chromium, chromedriver = _find(CHROMIUM), _find(CHROMEDRIVER)
    if chromium is None or chromedriver is None:
        _unavailable("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    service = Service(executable_path=str(chromedriver), log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
