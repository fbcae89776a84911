"""``agentsessions.sdk`` loads its names on first use: every name it exports resolves to the
object its module defines, and importing the package alone loads none of its modules."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import agentsessions.sdk as sdk


def test_every_exported_name_has_a_home_and_resolves_to_it() -> None:
    assert set(sdk.__all__) == set(sdk._HOMES)
    for name, home in sdk._HOMES.items():
        assert getattr(sdk, name) is getattr(importlib.import_module(f"agentsessions.sdk.{home}"), name)
    assert set(sdk.__all__) <= set(dir(sdk))


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        sdk.Nope  # noqa: B018
    with pytest.raises(ImportError):
        exec("from agentsessions.sdk import Nope")


def test_importing_the_package_loads_no_module_of_it() -> None:
    probe = (
        "import json, sys\n"
        "import agentsessions.sdk\n"
        "from agentsessions.sdk.errors import SinkError\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('agentsessions.sdk.'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["agentsessions.sdk.errors"]
