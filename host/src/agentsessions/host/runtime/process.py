"""The subprocess runtime: harness processes the host starts from its own configuration.

``--harness-process NAME=MODULE:ATTR`` makes the host run ``agentsessions-harness serve MODULE:ATTR
--listen unix:<dir>/<NAME>.sock`` (invoked as ``python -m agentsessions.sdk.cli`` with the host's
own interpreter), wait for its ``listening on ADDRESS`` line, and dial that address over
Harness.Connect. A process that dies is started again after a backoff that doubles up to a bound;
on host shutdown each one gets SIGTERM and, once the grace is spent, SIGKILL.

The process is the compute of the sessions attached to it through the Runtime calls the controller
makes: ``create`` (Exec), ``restore`` (Resume) and ``fork`` (Fork) attach a session and start the
process again if it was stopped; ``snapshot`` (Suspend, an approval park) and ``stop``
(DeleteSession) detach one, and the last live session leaving while no run uses the process stops
it (no restart until the next attach). The host owns these processes but cannot checkpoint their
memory: a restart (after a crash, an idle stop, or of the host) starts the harness from nothing,
and sessions carry on through the journal.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Coroutine, Mapping, Sequence

from agentsessions.host import logs
from agentsessions.host.controller.errors import HarnessUnavailableError
from agentsessions.host.harnesslink import DESCRIBE_MAX_AGE_S, RemoteHarness
from agentsessions.host.runtime.journal_backed import JournalBackedRuntime
from agentsessions.host.runtime.protocol import Incarnation, SnapshotRef
from agentsessions.sdk.harness import EventSink, Start
from agentsessions.sdk.structs import struct
from agentsessions.v1 import harness_pb2, session_pb2

log = logging.getLogger("agentsessions.runtime")

READY_PREFIX = "listening on "
# sun_path holds 108 bytes on Linux and 104 on macOS; longer socket paths fall back to loopback TCP.
MAX_UNIX_PATH = 100
STDERR_TAIL_LINES = 20
# How long reaping a killed process, or draining its pipes, may take before we stop waiting.
REAP_TIMEOUT_S = 10.0


class HarnessProcessError(Exception):
    """A harness process could not be started: bad target, early exit, or no readiness line in time."""


@struct
class _Link:
    """The Connect client of one process generation; closed once retired and no run uses it."""

    harness: RemoteHarness
    runs: int = 0
    retired: bool = False


class ProcessRuntime(JournalBackedRuntime):
    """One harness process started, watched and stopped by the host.

    ``socket_dir`` holds the unix socket (a private temporary directory when not given);
    ``listen`` overrides the address entirely (``127.0.0.1:0`` for loopback TCP). ``grace`` is how
    long a stopping process may take after SIGTERM. A crashed process is restarted after
    ``backoff_initial`` seconds, doubling per quick failure up to ``backoff_max``; the delay
    resets once a process has stayed up for ``stable_after`` seconds. A process stopped because no
    session needs it (see the module docstring) is not restarted until a session attaches again.
    ``describe_max_age`` is the link's (``RemoteHarness``): how long a process's descriptor serves
    admissions on one connection (``--harness-describe-max-age``; 0 Describes at every admission).
    """

    name = "subprocess"
    memory_loss = (
        "whenever its process restarts (after a crash, or with the host): the host starts the "
        "process but cannot checkpoint its memory"
    )

    def __init__(
        self,
        harness_name: str,
        target: str,
        *,
        socket_dir: str | None = None,
        listen: str | None = None,
        grace: float = 5.0,
        start_timeout: float = 30.0,
        backoff_initial: float = 0.2,
        backoff_max: float = 5.0,
        stable_after: float = 10.0,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        describe_max_age: float = DESCRIBE_MAX_AGE_S,
    ) -> None:
        super().__init__()
        self.describe_max_age = describe_max_age
        self.harness_name = harness_name
        self.target = target
        self.grace = grace
        self.start_timeout = start_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.stable_after = stable_after
        self._socket_dir = socket_dir
        self._listen = listen
        self._owned_dir: str | None = None
        self._cwd = cwd
        self._env = dict(env) if env is not None else None
        self.address = ""
        self.restarts = 0
        self.harness = SupervisedHarness(self)
        self._process: asyncio.subprocess.Process | None = None
        self._ready_at = 0.0
        self._link: _Link | None = None
        self._retired: list[_Link] = []
        self._changed = asyncio.Condition()
        self._started = False
        self._closing = False
        # Stopped because no attached session was live; the next attach (or run) starts it again.
        self._idle = False
        self._transition = asyncio.Lock()  # an idle stop and a wake never interleave
        self._supervisor: asyncio.Task[None] | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    # -- what the runtime reports ---------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The running process's pid (None before start, after close, or while restarting)."""
        process = self._process
        return process.pid if process is not None and self._link is not None else None

    def worker(self) -> str:
        return f"{socket.gethostname() or 'localhost'}/{self.pid or '-'}"

    def address_for(self, session: str) -> str:
        return self.address

    def reachable(self) -> bool:
        return self._link is not None and not self._closing

    def command(self, listen: str) -> list[str]:
        """The harness process's command line (``agentsessions-harness serve``, by module)."""
        return [
            sys.executable,
            "-m",
            "agentsessions.sdk.cli",
            "serve",
            self.target,
            "--listen",
            listen,
            "--grace",
            f"{self.grace:g}",
            # Its standard input is a pipe this host holds: if the host dies, even by SIGKILL, the
            # pipe closes and the process stops by itself instead of serving an orphaned socket.
            "--stop-on-stdin-eof",
        ]

    async def ready(self, *, replacing: int | None = None) -> int:
        """Wait until a process is serving and return its pid; with ``replacing``, until a
        process other than that pid is serving (a restart). Callers bound the wait."""

        def serving() -> bool:
            return self._closing or (self.pid is not None and self.pid != replacing)

        async with self._changed:
            await self._changed.wait_for(serving)
        pid = self.pid
        if pid is None:
            raise HarnessProcessError(f"harness process {self.harness_name!r} is shutting down")
        return pid

    # -- the sessions' compute (Runtime) ---------------------------------------------------------

    async def create(self, session: str) -> Incarnation:
        """Attach ``session``: the process serves it (started again if it was idle-stopped, waited
        for through a restart); HarnessUnavailableError when no process comes up in time."""
        await super().create(session)
        await self.link_when_ready()
        return Incarnation(session, self.name, self.worker(), self.address_for(session))

    async def snapshot(self, session: str) -> SnapshotRef:
        ref = await super().snapshot(session)
        await self._stop_if_unused()
        return ref

    async def stop(self, session: str) -> None:
        await super().stop(session)
        await self._stop_if_unused()

    async def _stop_if_unused(self) -> None:
        """Stop the process once no attached session is live and no run is using it."""
        async with self._transition:
            if self._closing or self._idle or self._process is None or not self._unused():
                return
            self._idle = True
            process = self._process
            log.info(
                "harness process stopped: no live session",
                extra=logs.fields(harness=self.harness_name, pid=process.pid),
            )
            await self._stop_generation(process)

    def _unused(self) -> bool:
        live = any(state == session_pb2.COMPUTE_LIVE for state in self._states.values())
        return not live and not any(link.runs for link in self.links())

    async def _wake(self) -> None:
        """Start the process again after an idle stop."""
        async with self._transition:
            if not self._idle or self._closing:
                return
            try:
                await self._launch()
            except HarnessProcessError as exc:
                raise HarnessUnavailableError(str(exc)) from exc
            self._idle = False
            self._supervisor = asyncio.create_task(self._supervise(), name=f"supervise-{self.harness_name}")

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the process and wait for its readiness line; raises HarnessProcessError."""
        if self._started:
            return
        self._started = True
        if self._listen is None:
            directory = self._socket_dir
            if directory is None:
                directory = self._owned_dir = tempfile.mkdtemp(prefix="agentsessions-harness-")
            path = os.path.join(directory, f"{self.harness_name}.sock")
            self._listen = f"unix:{path}" if len(path) <= MAX_UNIX_PATH else "127.0.0.1:0"
        try:
            await self._launch()
        except BaseException:
            await self.close()
            raise
        self._supervisor = asyncio.create_task(self._supervise(), name=f"supervise-{self.harness_name}")

    async def close(self) -> None:
        """Stop the process: SIGTERM, then SIGKILL once ``grace`` has passed; no restarts after."""
        self._closing = True
        await self._notify()
        async with self._transition:  # a wake in progress finishes first, then is stopped here
            await self._stop_generation(self._process)
        for link in list(self._retired):
            if link.runs == 0:
                await self._close_link(link)
        if self._pipes:
            await asyncio.wait(self._pipes, timeout=REAP_TIMEOUT_S)
        if self._listen is not None and self._listen.startswith("unix:"):
            with contextlib.suppress(OSError):
                os.unlink(self._listen.removeprefix("unix:"))
        if self._owned_dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._owned_dir, True)
            self._owned_dir = None

    async def _stop_generation(self, process: asyncio.subprocess.Process | None) -> None:
        """Stop the supervisor (so the exit is no crash), the process, and retire its link."""
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
            self._supervisor = None
        if process is not None:
            await _stop_process(process, self.grace)
        self._process = None
        await self._retire_link()

    async def _launch(self) -> None:
        """Start one process generation and wait for ``listening on ADDRESS``."""
        listen = self._listen
        assert listen is not None
        if listen.startswith("unix:"):
            # A process killed with -9 leaves its socket file behind.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(listen.removeprefix("unix:"))
        try:
            process = await asyncio.create_subprocess_exec(
                *self.command(listen),
                stdin=asyncio.subprocess.PIPE,  # never written: it closes when this process ends
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                # Its own session: a terminal's Ctrl-C reaches the host, which stops it after the drain.
                start_new_session=True,
                cwd=self._cwd,
                env=self._env,
            )
        except OSError as exc:
            raise HarnessProcessError(
                f"harness process {self.harness_name!r} ({self.target}) could not be started: {exc}"
            ) from exc
        tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        assert process.stdout is not None and process.stderr is not None
        self._track(_drain_lines(process.stderr, tail.append))
        try:
            address = await self._await_ready_line(process, tail)
        except BaseException:
            await _stop_process(process, 0)
            raise
        self._track(_drain_lines(process.stdout, None))
        self._process = process
        self.address = address
        self._link = _Link(RemoteHarness(address, describe_max_age=self.describe_max_age))
        self._ready_at = asyncio.get_running_loop().time()
        log.info(
            "harness process ready",
            extra=logs.fields(harness=self.harness_name, pid=process.pid, address=address),
        )
        await self._notify()

    async def _await_ready_line(
        self, process: asyncio.subprocess.Process, tail: collections.deque[str]
    ) -> str:
        assert process.stdout is not None
        what = f"harness process {self.harness_name!r} ({self.target})"
        try:
            async with asyncio.timeout(self.start_timeout):
                while line := await process.stdout.readline():
                    text = line.decode(errors="replace").strip()
                    if text.startswith(READY_PREFIX):
                        return text.removeprefix(READY_PREFIX)
                code = await process.wait()
        except TimeoutError:
            raise HarnessProcessError(
                f"{what} printed no '{READY_PREFIX.strip()} ADDRESS' line within {self.start_timeout:g}s"
                f"{_quote(tail)}"
            ) from None
        # Let the stderr reader take the last lines the process wrote before it died.
        if self._pipes:
            await asyncio.wait(self._pipes, timeout=REAP_TIMEOUT_S)
        raise HarnessProcessError(f"{what} exited with code {code} before it was ready{_quote(tail)}")

    async def _supervise(self) -> None:
        """Restart the process whenever it exits, until the runtime closes."""
        loop = asyncio.get_running_loop()
        delay = self.backoff_initial
        while True:
            process = self._process
            assert process is not None
            code = await process.wait()
            if self._closing:
                return
            if loop.time() - self._ready_at >= self.stable_after:
                delay = self.backoff_initial
            log.warning(
                "harness process exited; restarting",
                extra=logs.fields(harness=self.harness_name, pid=process.pid, code=code, restart_in_s=delay),
            )
            await self._retire_link()
            while True:
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff_max)
                try:
                    await self._launch()
                    break
                except HarnessProcessError as exc:
                    log.warning(
                        "harness process restart failed",
                        extra=logs.fields(harness=self.harness_name, error=str(exc), retry_in_s=delay),
                    )
            self.restarts += 1

    # -- links ----------------------------------------------------------------------------------

    async def link_when_ready(self) -> _Link:
        """The current process's link, waiting (up to ``start_timeout``) through a restart, and
        starting the process again after an idle stop."""
        if self._idle:
            await self._wake()
        if self._link is None and not self._closing:
            with contextlib.suppress(TimeoutError, HarnessProcessError):
                async with asyncio.timeout(self.start_timeout):
                    await self.ready()
        link = self._link
        if link is None or self._closing:
            state = "stopping" if self._closing else "not running (restarting)"
            raise HarnessUnavailableError(f"harness process {self.harness_name!r} is {state}")
        return link

    def current_link(self) -> _Link | None:
        """The current process's link while it serves (no restart, idle stop or drain in the way);
        None when ``link_when_ready`` would have to wait or fail."""
        return None if self._idle or self._closing else self._link

    def links(self) -> list[_Link]:
        return [*([self._link] if self._link is not None else []), *self._retired]

    async def release(self, link: _Link) -> None:
        if link.retired and link.runs == 0 and link in self._retired:
            await self._close_link(link)

    async def _retire_link(self) -> None:
        link, self._link = self._link, None
        await self._notify()
        if link is None:
            return
        link.retired = True
        # A run still bridging on it ends by itself (its process is gone); close the channel after.
        if link.runs == 0:
            await link.harness.close()
        else:
            self._retired.append(link)

    async def _close_link(self, link: _Link) -> None:
        self._retired.remove(link)
        await link.harness.close()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _track(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.create_task(coro)
        self._pipes.add(task)
        task.add_done_callback(self._pipes.discard)


class SupervisedHarness:
    """The ``Harness`` a :class:`ProcessRuntime` hands the controller: whichever process is
    current, waiting through a restart instead of failing while the new one starts."""

    def __init__(self, runtime: ProcessRuntime) -> None:
        self._runtime = runtime

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        link = await self._runtime.link_when_ready()
        return await link.harness.describe()

    def current_descriptor(self) -> harness_pb2.HarnessDescriptor | None:
        """What the current process described on its current connection, while that still holds
        (``RemoteHarness.current_descriptor``); None when ``describe`` would ask, wait for a
        restart or wake an idle process. Admission takes it without an await."""
        link = self._runtime.current_link()
        return None if link is None else link.harness.current_descriptor()

    async def run(self, start: Start, sink: EventSink) -> None:
        link = await self._runtime.link_when_ready()
        link.runs += 1
        try:
            await link.harness.run(start, sink)
        finally:
            link.runs -= 1
            await self._runtime.release(link)

    async def cancel(self, execution_id: str, reason: str = "") -> bool:
        for link in self._runtime.links():
            if await link.harness.cancel(execution_id, reason):
                return True
        return False


class HarnessProcesses:
    """The ``--harness-process`` children of one host: sockets in one private directory, started
    together (any failure stops the rest), stopped together."""

    def __init__(
        self,
        entries: Sequence[tuple[str, str]],
        *,
        grace: float,
        start_timeout: float = 30.0,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        describe_max_age: float = DESCRIBE_MAX_AGE_S,
    ) -> None:
        self._entries = list(entries)
        self._describe_max_age = describe_max_age
        self._grace = grace
        self._start_timeout = start_timeout
        self._cwd = cwd
        self._env = env
        self._dir: str | None = None
        self.runtimes: dict[str, ProcessRuntime] = {}

    async def start(self) -> None:
        if not self._entries:
            return
        self._dir = tempfile.mkdtemp(prefix="agentsessions-harness-")
        for name, target in self._entries:
            self.runtimes[name] = ProcessRuntime(
                name,
                target,
                socket_dir=self._dir,
                grace=self._grace,
                start_timeout=self._start_timeout,
                cwd=self._cwd,
                env=self._env,
                describe_max_age=self._describe_max_age,
            )
        results = await asyncio.gather(
            *(runtime.start() for runtime in self.runtimes.values()), return_exceptions=True
        )
        failures = [str(result) for result in results if isinstance(result, BaseException)]
        if failures:
            await self.close()
            raise HarnessProcessError("; ".join(failures))

    async def close(self) -> None:
        results = await asyncio.gather(
            *(runtime.close() for runtime in self.runtimes.values()), return_exceptions=True
        )
        if self._dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._dir, True)
            self._dir = None
        for result in results:
            if isinstance(result, BaseException):
                raise result


async def _drain_lines(stream: asyncio.StreamReader, keep: Callable[[str], None] | None) -> None:
    """Read a pipe to its end so the process never blocks on a full pipe."""
    with contextlib.suppress(ValueError, ConnectionError):
        while line := await stream.readline():
            if keep is not None:
                keep(line.decode(errors="replace").rstrip())


async def _stop_process(process: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM the process group, SIGKILL it after ``grace``, and reap it."""
    if process.returncode is None:
        _signal_group(process, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await process.wait()
    if process.returncode is None:
        _signal_group(process, signal.SIGKILL)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(REAP_TIMEOUT_S):
            await process.wait()


def _signal_group(process: asyncio.subprocess.Process, signum: int) -> None:
    # The process leads its own session, so its group also holds anything it started.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def _quote(tail: collections.deque[str]) -> str:
    lines = [line for line in tail if line.strip()]
    return (": " + " | ".join(lines[-5:])) if lines else ""
