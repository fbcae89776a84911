"""Modes and tool classes: the words a harness and this host share about what a tool may do.

No v1 message changes; both are conventions on v1 fields (docs/modes.md).

**Tool classes** say what running a tool can do: ``read-only`` (reads, changes nothing),
``write`` (changes files or state), ``subprocess`` (starts programs, which may do anything the
machine lets them) and ``network`` (reaches other machines). A harness declares a tool's classes
at the end of the tool's ``ToolSpec.description`` in its descriptor, as a tag::

    ToolSpec(name="write_file", description="Create or overwrite a file. [tool-class: write]")
    ToolSpec(name="fetch", description="GET a URL. [tool-class: read-only, network]")

(:func:`with_tool_classes` writes the tag, :func:`declared_tool_classes` reads it). A v1 peer sees
a description. The host's own tool configuration declares the classes of host-run tools; the host
enforces the union of both, so a harness can make a tool stricter, never looser.

**Modes**, strictest first: ``plan`` (no write or subprocess tool runs), ``ask-before`` (every
write or subprocess needs approval), ``allow-edits`` (writes run, subprocesses need approval) and
``auto`` (everything runs; a subprocess runs confined where the host can confine it). A session's
mode is its ``agentsessions.io/mode`` annotation (:data:`MODE_ANNOTATION`); the host announces it
to the harness on each run (``agentsessions.sdk.extensions``), and a harness that follows it reads
it as ``Execution.host_mode``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

PLAN = "plan"
ASK_BEFORE = "ask-before"
ALLOW_EDITS = "allow-edits"
AUTO = "auto"
# Strictest first: an index is a strictness rank.
MODES = (PLAN, ASK_BEFORE, ALLOW_EDITS, AUTO)

READ_ONLY = "read-only"
WRITE = "write"
SUBPROCESS = "subprocess"
NETWORK = "network"
TOOL_CLASSES = (READ_ONLY, WRITE, SUBPROCESS, NETWORK)

MODE_ANNOTATION = "agentsessions.io/mode"

_TAG = re.compile(r"\s*\[tool-class:\s*([^\]]*)\]\s*\Z")


def check_mode(value: str) -> str:
    """``value`` when it names a mode; ValueError saying which modes there are otherwise."""
    if value not in MODES:
        raise ValueError(f"{value!r} is not a mode (modes: {', '.join(MODES)})")
    return value


def strictest(*modes: str) -> str:
    """The strictest of the given modes ("" means no mode and is skipped; "" when all are)."""
    ranked = [MODES.index(mode) for mode in modes if mode]
    return MODES[min(ranked)] if ranked else ""


def with_tool_classes(description: str, classes: Iterable[str]) -> str:
    """``description`` ending with the tag that declares ``classes`` (ValueError for a name that
    is not a tool class)."""
    names = list(dict.fromkeys(classes))
    unknown = [name for name in names if name not in TOOL_CLASSES]
    if unknown or not names:
        raise ValueError(f"tool classes must be some of {', '.join(TOOL_CLASSES)}, got {names!r}")
    tag = f"[tool-class: {', '.join(names)}]"
    return f"{description} {tag}" if description else tag


def declared_tool_classes(description: str) -> frozenset[str] | None:
    """The class names a description's tag declares (as written: a name that is not a tool class
    is kept, for the host to treat as the strictest), or None when it has no tag."""
    match = _TAG.search(description)
    if match is None:
        return None
    return frozenset(name.strip() for name in match.group(1).split(",") if name.strip())
