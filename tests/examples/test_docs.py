"""docs/harnesses.md's test-kit block runs as written, against the pydantic-ai example."""

from __future__ import annotations

import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


async def test_the_guides_test_kit_block_passes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    guide = (ROOT / "docs" / "harnesses.md").read_text()
    block = re.search(r"<!-- testkit:begin.*?-->\s*```python\n(.*?)```\s*<!-- testkit:end -->", guide, re.S)
    assert block, "docs/harnesses.md lost its test-kit block"
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    monkeypatch.setenv("SHOP_NOTES", str(tmp_path / "notes.txt"))
    monkeypatch.delitem(sys.modules, "pydantic_ai_agent", raising=False)
    namespace: dict[str, Any] = {}
    exec(compile(block.group(1), "docs/harnesses.md", "exec"), namespace)
    test: Callable[[], Awaitable[None]] = namespace["test_refund_parks_then_replays"]
    await test()
