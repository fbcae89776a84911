"""The examples stay what the docs promise: an ordinary agent of each framework, a wrapping part of
about ten lines at the end (issue #10 asked for about twenty), and the three kinds of tools."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MARK = "# == agentsessions: the wrapping part =="
# The wrapping part's budget: non-blank lines after the mark.
MOST_LINES = 20


def wrapping_part(source: str) -> list[str]:
    _, mark, tail = source.partition(MARK)
    assert mark, "the example lost its wrapping-part mark"
    return [line for line in tail.splitlines() if line.strip()]


@pytest.mark.parametrize("name", ["pydantic_ai_agent.py", "openai_agents_agent.py", "langgraph_agent.py"])
def test_each_example_wraps_an_ordinary_agent_in_a_few_lines(name: str) -> None:
    source = (EXAMPLES / name).read_text()
    part = wrapping_part(source)
    assert len(part) <= MOST_LINES, f"{name}: the wrapping part grew to {len(part)} lines"
    before = source.partition(MARK)[0]
    assert "agentsessions" not in re.sub(r'""".*?"""', "", before, flags=re.S), (
        f"{name}: the agent part imports or names agentsessions"
    )
    for tool in ("lookup_order", "add_note", "refund"):
        assert f"def {tool}(" in before, f"{name} lost its {tool} tool"
    assert any("host_tools=" in line for line in part) and "harness = " in "\n".join(part)
    assert (EXAMPLES / "tools.toml").read_text().count("[[python]]") == 2
