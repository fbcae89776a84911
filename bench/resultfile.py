"""A suite's results file (``bench/results/<suite>.json``): the machine it ran on, and the JSON
document written out, so every suite records the same facts in the same form."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["machine", "write"]


def machine(**extra: Any) -> dict[str, Any]:
    """The Python, the platform and the CPU count of this run (plus whatever a suite adds)."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        **extra,
    }


def write(out: Path, document: Mapping[str, Any], *, sort_keys: bool = True) -> None:
    """``document`` as indented JSON at ``out``, its folder created if need be."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2, sort_keys=sort_keys) + "\n")
