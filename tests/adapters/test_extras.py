"""The adapters' extras: declared on the SDK distribution, installed for the tests with the same pins."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_each_adapter_is_an_extra_pinned_as_the_tests_install_it() -> None:
    project = tomllib.loads((ROOT / "sdk" / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert sorted(extras) == ["langgraph", "openai-agents", "pydantic-ai"]
    assert sorted(project["dependencies"]) == ["grpcio>=1.85.1", "protobuf>=7.35.0"]
    dev = {
        line.split("==")[0]: line
        for line in (ROOT / "requirements-dev.txt").read_text().splitlines()
        if re.match(r"[A-Za-z0-9_.-]+==", line)
    }
    for extra, requirements in extras.items():
        for requirement in requirements:
            assert "==" in requirement, f"[{extra}] {requirement} is not pinned"
            name = requirement.split("==")[0]
            assert dev.get(name) == requirement, (
                f"requirements-dev.txt does not install [{extra}]'s {requirement}"
            )
    for module in ("pydantic_ai", "openai_agents", "langgraph"):
        assert (ROOT / "sdk" / "src" / "agentsessions" / "sdk" / "adapters" / f"{module}.py").is_file()
