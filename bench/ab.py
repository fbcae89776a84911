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
turn"). The machine's pace (``bench.resultfile``) is sampled every second throughout, and the
comparison is made twice: over every round, and over the steady rounds alone, whose two runs both
met the machine at its usual pace.

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
from bench.resultfile import SLOW_PACE
from bench.turns import BIN, CLIENT_SLACK_S, ROOT, _env, client_argv, cpu_seconds, fleet

RESULTS: Final = ROOT / "bench" / "results" / "ab.json"
# Where a tree keeps the packages a host and a harness import.
SOURCE_DIRS: Final = ("host/src", "sdk/src", "harnesses/src")
ECHO: Final = "agentsessions.harnesses.echo:EchoHarness"
WARMUP_TURNS: Final = 3
# What is compared: the medians of these figures of each tree's runs.
FIGURES: Final = ("turns_per_s", "host_cpu_ms_per_turn", "harness_cpu_ms_per_turn")
# The machine's pace sampled every second while the trees run: a round counts as steady when at
# most this share of each of its two runs' samples was slow.
PACE_EVERY_S: Final = 1.0
STEADY_SLOW_SHARE: Final = 0.2


@dataclass
class Run:
    """One tree's run: its turns a second over the window, the host's and the echo harness's CPU a
    turn in it, and how much of the window the machine spent in a slow spell."""

    round: int
    tree: str  # "new" or "old"
    turns_per_s: float
    host_cpu_ms_per_turn: float
    harness_cpu_ms_per_turn: float  # the echo harness process's (the tree's SDK)
    began: float  # the window, time.monotonic()
    ended: float
    # The share of the machine's pace samples in the window that were slow (over SLOW_PACE times
    # the fastest sample of the whole comparison); None: no sample fell in it.
    slow_share: float | None = None
    # The window's median pace sample over the comparison's fastest (1.0: the machine at its best).
    # Not a correction: in a slow spell the host's CPU a turn rises less than the fixed work's.
    pace_factor: float | None = None


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


def measure(round_: int, tree: str, sources: Sequence[str], sizes: Sizes, workdir: Path) -> Run:
    """One run of the tree whose sources are ``sources`` (none: the installed working tree)."""
    workdir.mkdir(parents=True)
    with fleet(workdir, sources) as f:
        echo = f.announced(
            "echo", [str(BIN / "agentsessions-harness"), "serve", ECHO, "--listen", "127.0.0.1:0"]
        )
        target = f.host("host", str(workdir / "journal.db"), {"bench-echo": echo})
        pid, harness = f.pids["host"], f.pids["echo"]
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
            # The work directory goes with the comparison's: what the host said comes along.
            said = (workdir / "host.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the {tree} tree's run failed; the end of its host's log:\n{said}")
        done = json.loads(out.strip().splitlines()[-1])
    turns_per_s = float(done["turns_per_s"])
    turns = turns_per_s * (ended - began)
    spent = [
        (b - a) / turns * 1000 if turns and a is not None and b is not None else 0.0
        for a, b in zip(before, after, strict=True)
    ]
    return Run(round_, tree, turns_per_s, spent[0], spent[1], began, ended)


def mark_slow(runs: Sequence[Run], timed: Sequence[tuple[float, float]]) -> None:
    """Each run's share of slow pace samples (``timed``: when each was taken, and its ms), slow
    meaning over ``SLOW_PACE`` times the fastest sample of the whole comparison."""
    if not timed:
        return
    fastest = min(ms for _, ms in timed)
    for run in runs:
        inside = [ms for at, ms in timed if run.began <= at <= run.ended]
        if inside:
            run.slow_share = resultfile.slow_share(inside, fastest)
            run.pace_factor = statistics.median(inside) / fastest


def compare(runs: Sequence[Run]) -> dict[str, Any]:
    """Medians per tree, their ratios new / old, and in how many rounds the new tree's host spent
    less (rounds with a run of each tree)."""
    medians = {}
    for tree in ("new", "old"):
        mine = [r for r in runs if r.tree == tree]
        if mine:
            medians[tree] = {key: statistics.median(getattr(r, key) for r in mine) for key in FIGURES}
    ratios = {}
    if len(medians) == 2:
        ratios = {
            key: medians["new"][key] / value
            for key, value in medians["old"].items()
            if value and key in medians["new"]
        }
    pairs = _pairs(runs)
    cheaper = sum(1 for new, old in pairs if new.host_cpu_ms_per_turn < old.host_cpu_ms_per_turn)
    return {"medians": medians, "ratios": ratios, "rounds": len(pairs), "rounds_new_cheaper": cheaper}


def summarize(runs: Sequence[Run]) -> dict[str, Any]:
    """``compare`` over every round, and over the steady rounds alone: those whose two runs both
    met the machine at its usual pace (at most ``STEADY_SLOW_SHARE`` of their samples slow)."""
    steady = [
        r
        for new, old in _pairs(runs)
        if all(x.slow_share is not None and x.slow_share <= STEADY_SLOW_SHARE for x in (new, old))
        for r in (new, old)
    ]
    return {"all": compare(runs), "steady": compare(steady)}


def _pairs(runs: Sequence[Run]) -> list[tuple[Run, Run]]:
    by_round: dict[int, dict[str, Run]] = {}
    for run in runs:
        by_round.setdefault(run.round, {})[run.tree] = run
    return [(trees["new"], trees["old"]) for _, trees in sorted(by_round.items()) if len(trees) == 2]


def _report(name: str, found: dict[str, Any]) -> None:
    for tree, m in found["medians"].items():
        print(
            f"{name}, median {tree}: {m['turns_per_s']:.1f} turns/s, CPU a turn: host "
            f"{m['host_cpu_ms_per_turn']:.3f} ms, harness {m['harness_cpu_ms_per_turn']:.3f} ms"
        )
    ratios = found["ratios"]
    if ratios:
        print(
            f"{name}, new / old: host CPU a turn {ratios['host_cpu_ms_per_turn']:.3f}, harness CPU a "
            f"turn {ratios['harness_cpu_ms_per_turn']:.3f}, turns/s {ratios['turns_per_s']:.3f}; the new "
            f"tree's host spent less in {found['rounds_new_cheaper']} of {found['rounds']} rounds"
        )


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
    with (
        tempfile.TemporaryDirectory(prefix="agentsessions-bench-ab-") as tmp,
        resultfile.PaceSampler(PACE_EVERY_S) as sampler,
    ):
        work = Path(tmp)
        old_sources = extract(args.rev, work / "old-tree")
        trees = {"new": (), "old": tuple(old_sources)}
        for i in range(1, sizes.rounds + 1):
            order = ("new", "old") if i % 2 else ("old", "new")
            for tree in order:
                run = measure(i, tree, trees[tree], sizes, work / f"round-{i}-{tree}")
                runs.append(run)
                print(
                    f"round {i} {tree}: {run.turns_per_s:7.1f} turns/s, CPU a turn: host "
                    f"{run.host_cpu_ms_per_turn:.3f} ms, harness {run.harness_cpu_ms_per_turn:.3f} ms",
                    flush=True,
                )
    mark_slow(runs, sampler.timed)
    for run in runs:
        if run.slow_share is None or run.pace_factor is None:
            print(f"round {run.round} {run.tree}: the machine's pace not sampled")
        else:
            print(
                f"round {run.round} {run.tree}: {run.slow_share:.0%} of its pace samples slow, their "
                f"median {run.pace_factor:.2f}x the fastest"
            )
    summary = summarize(runs)
    _report("all rounds", summary["all"])
    if summary["steady"]["rounds"]:
        _report("steady rounds", summary["steady"])
    else:
        print(
            f"steady rounds: none (no round whose two runs had at most {STEADY_SLOW_SHARE:.0%} slow samples)"
        )
    document = {
        "suite": "ab",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "old": args.rev,
        "new": "the working tree",
        "sizes": asdict(sizes),
        "runs": [asdict(r) for r in runs],
        **summary,
        "pace": {
            "every_s": PACE_EVERY_S,
            "slow_over_fastest": SLOW_PACE,
            "steady_slow_share": STEADY_SLOW_SHARE,
        },
        "machine": resultfile.machine(),
    }
    resultfile.write(args.out, document)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
