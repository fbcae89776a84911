"""The thin SDK installs on its own: a clean venv, ``pip install ./sdk``, and nothing arrives but the
SDK, grpcio, protobuf and what those two need. Uses the package index; set
AGENTSESSIONS_SKIP_SDK_INSTALL=1 to skip it when offline.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALL_TIMEOUT = 900

pytestmark = [
    pytest.mark.skipif(
        os.environ.get("AGENTSESSIONS_SKIP_SDK_INSTALL", "") not in ("", "0"),
        reason="AGENTSESSIONS_SKIP_SDK_INSTALL is set",
    ),
    pytest.mark.timeout(INSTALL_TIMEOUT + 120),
]

# Run inside the fresh venv: every installed distribution and the names it requires
# (requirements that only apply to an extra are left out).
LIST_DISTRIBUTIONS = r"""
import importlib.metadata as metadata, json, re
found = {}
for dist in metadata.distributions():
    requires = []
    for requirement in dist.requires or []:
        if re.search(r"\bextra\s*==", requirement):
            continue
        requires.append(re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0])
    found[dist.metadata["Name"]] = requires
print(json.dumps(found))
"""


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr}"
    return done


def test_sdk_installs_alone_with_only_grpcio_and_protobuf(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    python = str(venv / "bin" / "python")
    # Build from a copy so the build never writes into the checkout.
    source = tmp_path / "sdk"
    shutil.copytree(ROOT / "sdk", source, ignore=shutil.ignore_patterns("*.egg-info", "build", "__pycache__"))
    run([python, "-m", "pip", "install", "--disable-pip-version-check", "-q", str(source)], cwd=tmp_path)

    imported = run(
        [
            python,
            "-c",
            "import agentsessions.v1.session_pb2 as contract, agentsessions.sdk; print(contract.__file__)",
        ],
        cwd=tmp_path,
    )
    assert imported.stdout.strip().startswith(str(venv)), imported.stdout

    installed = {
        canonical(name): [canonical(r) for r in requires]
        for name, requires in json.loads(run([python, "-c", LIST_DISTRIBUTIONS], cwd=tmp_path).stdout).items()
    }
    assert sorted(installed["agentsessions-sdk"]) == ["grpcio", "protobuf"]
    allowed = {"agentsessions-sdk"}
    pending = ["agentsessions-sdk"]
    while pending:
        for requirement in installed.get(pending.pop(), []):
            if requirement not in allowed:
                allowed.add(requirement)
                pending.append(requirement)
    # pip (and setuptools on older Pythons) come with every venv.
    extra = set(installed) - allowed - {"pip", "setuptools", "wheel"}
    assert not extra, f"installing the SDK brought in {sorted(extra)}"
