"""``python -m bench [SUITE ...] [--quick] [--long] [--backends memory,sqlite,postgres]``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from bench import bigstream, compaction, journal, listing, load, replay, startup, turns

SUITES = ("journal", "turns", "replay", "listing", "startup", "bigstream", "load", "compaction")
# The load and compaction suites take minutes (load has its own flags: python -m bench.load --help):
# run them by name.
DEFAULT_SUITES = ("journal", "turns", "replay", "listing", "startup", "bigstream")
BACKENDS = ("memory", "sqlite", "postgres")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "suites",
        nargs="*",
        metavar="SUITE",
        help=f"one of {', '.join(SUITES)} (default: {', '.join(DEFAULT_SUITES)})",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run, not a measurement")
    parser.add_argument(
        "--long", action="store_true", help="turns: flatness at turn 10,000 too (a few minutes more)"
    )
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help="comma-separated journal backends (postgres needs AGENTSESSIONS_BENCH_PG_URL)",
    )
    args = parser.parse_args(argv)
    strange = sorted(set(args.suites) - set(SUITES))
    if strange:
        parser.error(f"unknown suite(s): {', '.join(strange)}")
    backends = [b for b in args.backends.split(",") if b]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backend(s): {', '.join(unknown)}")
    code = 0
    for suite in args.suites or DEFAULT_SUITES:
        if suite == "journal":
            code = max(code, journal.run(quick=args.quick, backends=backends))
        elif suite == "turns":
            code = max(code, turns.run(quick=args.quick, long=args.long))
        elif suite == "replay":
            code = max(code, replay.run(quick=args.quick))
        elif suite == "listing":
            code = max(code, listing.run(quick=args.quick))
        elif suite == "startup":
            code = max(code, startup.run(quick=args.quick))
        elif suite == "bigstream":
            code = max(code, bigstream.run(quick=args.quick))
        elif suite == "load":
            code = max(code, load.run(["--quick"] if args.quick else []))
        elif suite == "compaction":
            code = max(code, compaction.run(quick=args.quick))
    return code


if __name__ == "__main__":
    sys.exit(main())
