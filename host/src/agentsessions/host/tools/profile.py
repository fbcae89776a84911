"""What the host knows about a tool it runs besides how to run it: its classes (read-only, write,
subprocess, network: ``agentsessions.sdk.modes``), the directory it acts in, and, for a process the
host starts, whether that process runs confined.

The tools configuration declares these (``class``, ``workspace_arg``, ``workspace_roots``; see
``agentsessions.host.tools.config``); the controller's mode check reads them through
``ToolRegistry.profile`` before every call it runs (docs/modes.md).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Mapping
from dataclasses import field
from typing import Any

from agentsessions.host.tools.errors import ToolConfigError
from agentsessions.sdk.modes import TOOL_CLASSES
from agentsessions.sdk.structs import struct


def parse_tool_classes(value: object, where: str) -> frozenset[str]:
    """A ``class`` setting (one name or a list of names) as a set; ToolConfigError naming ``where``."""
    if isinstance(value, str):
        names: list[object] = [value]
    elif isinstance(value, list):
        names = value
    else:
        raise ToolConfigError(f"{where}: expected a tool class or a list of them ({', '.join(TOOL_CLASSES)})")
    classes = set()
    for name in names:
        if name not in TOOL_CLASSES:
            raise ToolConfigError(
                f"{where}: {name!r} is not a tool class (classes: {', '.join(TOOL_CLASSES)})"
            )
        classes.add(str(name))
    if not classes:
        raise ToolConfigError(f"{where}: name at least one tool class ({', '.join(TOOL_CLASSES)})")
    return frozenset(classes)


@struct(frozen=True)
class Confinement:
    """How a subprocess tool's next run goes: confined (and how), or why the host cannot confine it."""

    confined: bool
    detail: str

    def receipt(self) -> dict[str, Any]:
        """What a receipt says about it."""
        return {"confined": self.confined, "detail": self.detail}


def _inside(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


@struct(frozen=True)
class WorkspaceRule:
    """Where a tool acts: a fixed directory, or the directory one of its arguments names; with
    ``roots``, the directories an argument's workspace must lie under to run without approval."""

    argument: str = ""
    directory: str = ""
    roots: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if bool(self.argument) == bool(self.directory):
            raise ValueError("a workspace rule names either an argument or a directory")

    def workspace_of(self, args: Mapping[str, Any]) -> str | None:
        """The workspace a call names (None: the argument is missing or not a string)."""
        if self.directory:
            return self.directory
        value = args.get(self.argument)
        return value if isinstance(value, str) and value else None

    async def outside(self, args: Mapping[str, Any]) -> str | None:
        """Why a call acts outside its workspace roots, or None (inside them, or no roots to keep).
        Symlinks are resolved (in a worker thread), so a link out of a root counts as outside."""
        if not self.roots:
            return None
        workspace = self.workspace_of(args)
        if workspace is None:
            return f"argument {self.argument!r} names no workspace"
        if not os.path.isabs(workspace):
            return f"workspace {workspace!r} is not an absolute path"
        real, roots = await asyncio.to_thread(_resolved, workspace, self.roots)
        if _inside(real, roots):
            return None
        return f"workspace {workspace!r} is not under {', '.join(self.roots)}"


def _resolved(workspace: str, roots: tuple[str, ...]) -> tuple[str, list[str]]:
    return os.path.realpath(workspace), [os.path.realpath(root) for root in roots]


@struct(frozen=True)
class ToolProfile:
    """A host-run tool's classes (empty: unclassified), workspace and confinement."""

    classes: frozenset[str] = field(default_factory=frozenset)
    workspace: WorkspaceRule | None = None
    # Set for a process the host starts for each call; None: the host does not start the tool's
    # process itself, so a subprocess-class tool of this profile cannot be confined.
    confinement: Confinement | None = None
