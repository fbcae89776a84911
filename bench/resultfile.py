"""A suite's results file (``bench/results/<suite>.json``): the machine it ran on (and, for the
suites that time it, that machine's pace while they ran), and the JSON document written out, so
every suite records the same facts in the same form."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

__all__ = ["PaceSampler", "machine", "pace", "pace_line", "sampled_line", "slow_share", "write"]

PACE_REPEATS: Final = 7
# A sample counts as slow past this multiple of the run's fastest.
SLOW_PACE: Final = 1.3


def machine(**extra: Any) -> dict[str, Any]:
    """The Python, the platform and the CPU count of this run (plus whatever a suite adds)."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        **extra,
    }


def pace(repeats: int = PACE_REPEATS) -> float:
    """Milliseconds of CPU this machine spends on a fixed piece of work of the kind a host does
    (Python calls and dicts, protobuf encoding and decoding, SHA-256, JSON), the best of
    ``repeats``: ~13 ms on the benchmark machine when it runs at its usual speed.

    CPU time, not wall time, so a busy machine's waits for a core do not count: what moves it is
    the machine itself. This virtual machine has slow spells, from under a second to minutes long,
    in which the same work costs up to 1.7x the CPU; the suites time the pace when they start and
    end and sample it while they run (``PaceSampler``), so a run's figures can be read against the
    machine it met."""
    from agentsessions.v1 import common_pb2

    text = common_pb2.Part(text=common_pb2.TextPart(text="a reference turn's input " * 4))
    event = common_pb2.Event(
        execution_id="e" * 16,
        kind=common_pb2.EVENT_INPUT,
        message=common_pb2.Message(role="user", parts=[text]),
    )
    best = float("inf")
    for _ in range(repeats):
        began = time.thread_time()
        table: dict[str, int] = {}
        for i in range(2_000):
            record = common_pb2.LogRecord(seq=i, prev_hash="0" * 64, content_hash="1" * 64, fence=1)
            record.event.CopyFrom(event)
            blob = record.SerializeToString()
            common_pb2.LogRecord.FromString(blob)
            digest = hashlib.sha256(blob).hexdigest()
            table[digest[:8]] = table.get(digest[:8], 0) + len(json.dumps({"seq": i, "hash": digest}))
            for j in range(10):
                _step(table, j)
        best = min(best, time.thread_time() - began)
    return best * 1000


def _step(table: dict[str, int], j: int) -> int:
    return table.setdefault(str(j), j)


class PaceSampler:
    """The machine's pace (one repeat of ``pace``) every ``every_s`` seconds, in a process of its
    own, while a suite runs: ~13 ms of CPU every 3 s, under 0.5% of a core."""

    def __init__(self, every_s: float = 3.0) -> None:
        self.every_s = every_s
        self.samples: list[float] = []
        # Each sample with when it was taken (time.monotonic(), the same clock in every process).
        self.timed: list[tuple[float, float]] = []
        self.sampled = threading.Event()  # set at the first sample
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> PaceSampler:
        root = Path(__file__).resolve().parent.parent
        path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bench.resultfile", "--every", str(self.every_s)],
            cwd=root,
            env={**os.environ, "PYTHONPATH": path},
            stdout=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, args=(self._proc,), daemon=True)
        self._reader.start()
        return self

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            at, ms = (float(word) for word in line.split())
            self.timed.append((at, ms))
            self.samples.append(ms)
            self.sampled.set()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=30)
        if self._reader is not None:
            self._reader.join(timeout=30)

    def summary(self) -> dict[str, float]:
        """The samples' count, fastest, median and mean (ms), and the share of them that were slow
        (over ``SLOW_PACE`` times the fastest)."""
        if not self.samples:
            return {"samples": 0}
        fastest = min(self.samples)
        return {
            "samples": len(self.samples),
            "fastest_ms": fastest,
            "median_ms": statistics.median(self.samples),
            "mean_ms": statistics.fmean(self.samples),
            "slow_share": slow_share(self.samples, fastest),
        }


def slow_share(samples: Sequence[float], fastest: float) -> float:
    """The share of pace ``samples`` (ms, at least one) slower than ``SLOW_PACE`` times ``fastest``."""
    return sum(1 for ms in samples if ms > SLOW_PACE * fastest) / len(samples)


def pace_line(pace: Mapping[str, Any]) -> str:
    """A run's pace figures, as its report prints them."""
    ends = ", ".join(
        f"{when.removesuffix('_ms')} {pace[when]:.1f} ms" for when in pace if when.endswith("_ms")
    )
    line = (
        f"machine pace (ms of CPU for a fixed piece of work, best of {PACE_REPEATS}; lower is faster): {ends}"
    )
    during = pace.get("during")
    return f"{line}; during the run: {sampled_line(during)}" if during else line


def sampled_line(during: Mapping[str, Any]) -> str:
    """A ``PaceSampler.summary``, as a report prints it."""
    if not during.get("samples"):
        return "not sampled"
    return (
        f"sampled {during['samples']} times, fastest {during['fastest_ms']:.1f} ms, median "
        f"{during['median_ms']:.1f}, {during['slow_share']:.0%} slow (over {SLOW_PACE}x the fastest)"
    )


def write(out: Path, document: Mapping[str, Any], *, sort_keys: bool = True) -> None:
    """``document`` as indented JSON at ``out``, its folder created if need be."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2, sort_keys=sort_keys) + "\n")


def _sample(every_s: float) -> None:
    """Print one repeat of ``pace`` every ``every_s`` seconds until terminated."""
    while True:
        ms = pace(repeats=1)
        print(f"{time.monotonic():.3f} {ms:.3f}", flush=True)
        time.sleep(every_s)


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    _sample(float(sys.argv[sys.argv.index("--every") + 1]) if "--every" in sys.argv else 3.0)
