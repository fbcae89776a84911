"""Two trees of the host, alternated: does a change make a turn cheaper?

``python -m bench.ab REV [--rounds 6] [--sessions 32] [--seconds 14] [--out PATH] [--quick]``

Measures the working tree's host against the host of ``REV`` (any git revision of this
repository): each run starts an echo harness and an ``agentsessions serve`` (SQLite journal,
synchronous=FULL, as shipped) of one tree, drives ``--sessions`` sessions of echo turns through it
with the turns suite's client for ``--seconds``, and reads over a window inside that time the
host's CPU (every thread of the process, user and system, from ``/proc``), the echo harness's (the
tree's SDK) and the turns a second.
``REV``'s sources come from ``git archive`` into a temporary directory and go ahead of the installed
packages on its processes' path; the client and this program are the working tree's.

The trees take turns, and which goes first changes every round, so both meet the same minutes of
the machine. On a shared machine a run's CPU a turn swings by ±10% with the machine's pace, more
than most changes move it: a single run of each tree says little, and the median over the rounds,
with how many rounds the new tree spent less, is what to read (bench/NOTEBOOK.md, "Fewer frames a
turn"). Each run also records the machine's pace before it (``bench.resultfile.pace``).

Prints every run, the medians and the ratios new / old; writes ``bench/results/ab.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from bench import resultfile
from bench.turns import BIN, CLIENT_SLACK_S, ROOT, _env, client_argv, cpu_seconds, fleet

RESULTS: Final = ROOT / "bench" / "results" / "ab.json"
# Where a tree keeps the packages a host and a harness import.
SOURCE_DIRS: Final = ("host/src", "sdk/src", "harnesses/src")
ECHO: Final = "agentsessions.harnesses.echo:EchoHarness"
WARMUP_TURNS: Final = 3


@dataclass
class Run:
    """One tree's run: its turns a second over the window and the host's CPU a turn in it."""

    tree: str  # "new" or "old"
    turns_per_s: float
    host_cpu_ms_per_turn: float
    harness_cpu_ms_per_turn: float  # the echo harness process's (the tree's SDK)
    pace_ms: float  # the machine's pace just before the run (lower is faster)


@dataclass
class Sizes:
    rounds: int
    sessions: int
    seconds: float


def extract(rev: str, into: Path) -> list[str]:
    """``rev``'s source directories, extracted from the repository into ``into``."""
    found = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        raise SystemExit(f"bench.ab: {rev!r} names no commit of this repository")
    commit = found.stdout.strip()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, *SOURCE_DIRS],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise SystemExit(f"bench.ab: git archive {commit}: {archive.stderr.decode(errors='replace')}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    dirs = [str(into / d) for d in SOURCE_DIRS if (into / d).is_dir()]
    if not (into / "host" / "src" / "agentsessions").is_dir():
        raise SystemExit(f"bench.ab: {rev} has no host/src/agentsessions to run")
    imported = imported_from(dirs)
    stray = {name: path for name, path in imported.items() if not path.startswith(str(into))}
    if stray:
        raise SystemExit(f"bench.ab: with {rev}'s sources first, these still import from elsewhere: {stray}")
    return dirs


def imported_from(sources: Sequence[str]) -> dict[str, str]:
    """Where a server process given ``sources`` imports the host, the SDK and the harnesses from."""
    probe = (
        "import json, agentsessions.host, agentsessions.sdk, agentsessions.harnesses\n"
        "print(json.dumps({m.__name__: m.__file__ for m in "
        "(agentsessions.host, agentsessions.sdk, agentsessions.harnesses)}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env=_env(None, sources),
        capture_output=True,
        text=True,
        check=True,
    )
    found: dict[str, str] = json.loads(done.stdout)
    return found


def measure(tree: str, sources: Sequence[str], sizes: Sizes, workdir: Path) -> Run:
    """One run of the tree whose sources are ``sources`` (none: the installed working tree)."""
    workdir.mkdir(parents=True)
    with fleet(workdir, sources) as f:
        echo = f.announced(
            "echo", [str(BIN / "agentsessions-harness"), "serve", ECHO, "--listen", "127.0.0.1:0"]
        )
        target = f.host("host", str(workdir / "journal.db"), {"bench-echo": echo})
        pid, harness = f.pids["host"], f.pids["echo"]
        pace_ms = resultfile.pace()
        argv = client_argv(target, "bench-echo", sizes.sessions, WARMUP_TURNS, sizes.seconds)
        client = subprocess.Popen(
            argv, cwd=ROOT, env=_env(None), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True
        )
        # The window: after the warm-up turns, before the client's last second.
        lead = min(2.0, sizes.seconds / 4)
        time.sleep(lead)
        before, began = (cpu_seconds(pid), cpu_seconds(harness)), time.monotonic()
        time.sleep(max(0.5, sizes.seconds - lead - 1.0))
        after, ended = (cpu_seconds(pid), cpu_seconds(harness)), time.monotonic()
        out, _ = client.communicate(timeout=sizes.seconds + CLIENT_SLACK_S)
        if client.returncode != 0 or None in before or None in after:
            raise RuntimeError(f"the {tree} tree's run failed (see {workdir})")
        done = json.loads(out.strip().splitlines()[-1])
    turns_per_s = float(done["turns_per_s"])
    turns = turns_per_s * (ended - began)
    spent = [
        (b - a) / turns * 1000 if turns and a is not None and b is not None else 0.0
        for a, b in zip(before, after, strict=True)
    ]
    return Run(tree, turns_per_s, spent[0], spent[1], pace_ms)


def summarize(runs: Sequence[Run]) -> dict[str, Any]:
    """Medians per tree, their ratios new / old, and in how many rounds the new tree spent less."""
    new = [r for r in runs if r.tree == "new"]
    old = [r for r in runs if r.tree == "old"]
    medians = {
        tree: {
            "turns_per_s": statistics.median(r.turns_per_s for r in rs),
            "host_cpu_ms_per_turn": statistics.median(r.host_cpu_ms_per_turn for r in rs),
            "harness_cpu_ms_per_turn": statistics.median(r.harness_cpu_ms_per_turn for r in rs),
        }
        for tree, rs in (("new", new), ("old", old))
        if rs
    }
    ratios = {}
    if "new" in medians and "old" in medians:
        ratios = {
            key: medians["new"][key] / medians["old"][key] for key in medians["new"] if medians["old"][key]
        }
    cheaper = sum(
        1 for n, o in zip(new, old, strict=False) if n.host_cpu_ms_per_turn < o.host_cpu_ms_per_turn
    )
    return {
        "medians": medians,
        "ratios": ratios,
        "rounds_new_cheaper": cheaper,
        "rounds": min(len(new), len(old)),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "rev", help="the git revision to measure the working tree against (e.g. HEAD, main~3)"
    )
    parser.add_argument("--rounds", type=int, default=6, help="runs of each tree, alternated (default 6)")
    parser.add_argument("--sessions", type=int, default=32, help="concurrent sessions (default 32)")
    parser.add_argument("--seconds", type=float, default=14.0, help="each run's turns (default 14)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--quick", action="store_true", help="one round of 2 sessions for 3 s: a smoke run")
    args = parser.parse_args(argv)
    sizes = Sizes(1, 2, 3.0) if args.quick else Sizes(args.rounds, args.sessions, args.seconds)
    if sizes.rounds < 1 or sizes.sessions < 1 or sizes.seconds < 2:
        parser.error("--rounds and --sessions must be at least 1, --seconds at least 2")
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="agentsessions-bench-ab-") as tmp:
        work = Path(tmp)
        old_sources = extract(args.rev, work / "old-tree")
        trees = {"new": (), "old": tuple(old_sources)}
        for i in range(sizes.rounds):
            order = ("new", "old") if i % 2 == 0 else ("old", "new")
            for tree in order:
                run = measure(tree, trees[tree], sizes, work / f"round-{i + 1}-{tree}")
                runs.append(run)
                print(
                    f"round {i + 1} {tree}: {run.turns_per_s:7.1f} turns/s, CPU a turn: host "
                    f"{run.host_cpu_ms_per_turn:.3f} ms, harness {run.harness_cpu_ms_per_turn:.3f} ms "
                    f"(pace {run.pace_ms:.1f} ms)",
                    flush=True,
                )
    summary = summarize(runs)
    for tree, m in summary["medians"].items():
        print(
            f"median {tree}: {m['turns_per_s']:.1f} turns/s, CPU a turn: host "
            f"{m['host_cpu_ms_per_turn']:.3f} ms, harness {m['harness_cpu_ms_per_turn']:.3f} ms"
        )
    ratios = summary["ratios"]
    if ratios:
        print(
            f"new / old: host CPU a turn {ratios['host_cpu_ms_per_turn']:.3f}, harness CPU a turn "
            f"{ratios['harness_cpu_ms_per_turn']:.3f}, turns/s {ratios['turns_per_s']:.3f}; the new "
            f"tree's host spent less in {summary['rounds_new_cheaper']} of {summary['rounds']} rounds"
        )
    document = {
        "suite": "ab",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "old": args.rev,
        "new": "the working tree",
        "sizes": asdict(sizes),
        "runs": [asdict(r) for r in runs],
        **summary,
        "machine": resultfile.machine(),
    }
    resultfile.write(args.out, document)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
