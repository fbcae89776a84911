"""The README's fenced blocks, which the tests run as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_block(name: str, language: str) -> str:
    """The fenced block between ``<!-- NAME:begin ... -->`` and ``<!-- NAME:end -->``."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(
        rf"<!-- {name}:begin.*?-->\s*```{language}\n(.*?)```\s*<!-- {name}:end -->", readme, re.S
    )
    assert block, f"README lost its {name} block"
    return block.group(1)
