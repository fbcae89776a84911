"""Running a host-started tool process confined: bubblewrap (Debian's ``bubblewrap`` package).

A confined process gets no network (a network namespace of its own holding only a loopback
device), its workspace writable, a private empty ``/tmp`` (unless the tool sets ``private_tmp =
false``: then the host's ``/tmp``, read-only), and the rest of the file system read-only; it cannot
outlive the host (``--die-with-parent``) and starts a session of its own. A tool configured with
``network = true`` keeps the host's network (and declares the class).

Whether it can is found out once, by running ``true`` under the same options
(:meth:`Bubblewrap.probe`): a missing binary or a kernel that refuses the namespaces gives an
unconfined :class:`Confinement` saying why, and the mode check then gates the tool on approval
("confine if you can, gate if you can't", docs/modes.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import Sequence

from agentsessions.host.tools.profile import Confinement

log = logging.getLogger(__name__)

DEFAULT_BWRAP = "bwrap"  # looked up on PATH
PROBE_TIMEOUT_S = 10.0
_STDERR_LIMIT = 2000


def _isolation(network: bool, private_tmp: bool) -> list[str]:
    shared = ["--share-net"] if network else []
    scratch = ["--tmpfs", "/tmp"] if private_tmp else []
    return [
        "--die-with-parent",
        "--new-session",
        "--unshare-all",
        *shared,
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        *scratch,
    ]


class Bubblewrap:
    """Confines a command with the bubblewrap binary at ``path`` (a name is looked up on PATH)."""

    def __init__(self, path: str = DEFAULT_BWRAP) -> None:
        self.path = path
        self._status: Confinement | None = None
        self._lock = asyncio.Lock()
        self._binary = ""

    @property
    def binary(self) -> str:
        """The binary a successful probe found ("" before one)."""
        return self._binary

    def describe(self, network: bool) -> str:
        reach = "the host's network" if network else "no network"
        return f"bubblewrap ({self._binary}): {reach}, the workspace writable, the rest read-only"

    async def probe(self) -> Confinement:
        """Whether commands can be confined here (found out once, bounded in time)."""
        async with self._lock:
            if self._status is None:
                self._status = await self._probe()
                if self._status.confined:
                    log.info("tool confinement: %s", self.describe(False))
                else:
                    log.warning("tool confinement unavailable: %s", self._status.detail)
            return self._status

    async def _probe(self) -> Confinement:
        binary = await asyncio.to_thread(_find, self.path)
        if binary is None:
            where = f"at {self.path}" if os.sep in self.path else f"named {self.path!r} on PATH"
            return Confinement(False, f"no bubblewrap {where}")
        self._binary = binary
        try:
            process = await asyncio.create_subprocess_exec(
                binary,
                *_isolation(False, True),
                "--",
                "true",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            return Confinement(False, f"bubblewrap at {binary} does not start: {exc.strerror or exc}")
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                _, stderr = await process.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            return Confinement(
                False, f"bubblewrap at {binary} did not finish a test run in {PROBE_TIMEOUT_S:g} s"
            )
        if process.returncode != 0:
            said = stderr.decode("utf-8", errors="replace").strip()[:_STDERR_LIMIT] or "no message"
            return Confinement(
                False, f"bubblewrap at {binary} cannot confine here (exit {process.returncode}: {said})"
            )
        return Confinement(True, self.describe(False))

    def command(
        self, argv: Sequence[str], workspace: str, *, network: bool, private_tmp: bool = True
    ) -> list[str]:
        """``argv`` confined to ``workspace`` (call after a successful :meth:`probe`);
        ``private_tmp``: an empty ``/tmp`` of its own (else the host's, read-only)."""
        if not self._binary:
            raise RuntimeError("bubblewrap has not been probed successfully")
        return [
            self._binary,
            *_isolation(network, private_tmp),
            "--bind",
            workspace,
            workspace,
            "--chdir",
            workspace,
            "--",
            *argv,
        ]


def _find(path: str) -> str | None:
    if os.sep in path:
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return shutil.which(path)
