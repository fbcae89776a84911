"""``bench.ab``: two trees of the host alternated. Its summary from runs, the old tree's sources
taken from the repository (and imported ahead of the installed packages), and a smoke run against
HEAD with real processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import ab
from bench.ab import Run, extract, imported_from, mark_slow, summarize


def _run(round_: int, tree: str, turns: float, host: float, harness: float, slow: float | None) -> Run:
    return Run(
        round_, tree, turns, host, harness, began=10.0 * round_, ended=10.0 * round_ + 5, slow_share=slow
    )


def test_the_summary_takes_medians_their_ratios_and_the_rounds_the_new_tree_spent_less() -> None:
    runs = [
        _run(1, "new", 600.0, 1.80, 0.60, 0.0),
        _run(1, "old", 560.0, 2.00, 0.62, 0.1),
        _run(2, "old", 500.0, 2.10, 0.66, 0.0),
        _run(2, "new", 480.0, 2.20, 0.70, 0.5),  # a slow spell: the new tree spent more this round
        _run(3, "new", 590.0, 1.90, 0.61, 0.2),
        _run(3, "old", 570.0, 1.95, 0.64, None),  # no pace sample fell in this run
    ]
    summary = summarize(runs)
    every = summary["all"]
    assert every["medians"] == {
        "new": {"turns_per_s": 590.0, "host_cpu_ms_per_turn": 1.90, "harness_cpu_ms_per_turn": 0.61},
        "old": {"turns_per_s": 560.0, "host_cpu_ms_per_turn": 2.00, "harness_cpu_ms_per_turn": 0.64},
    }
    assert every["ratios"] == pytest.approx(
        {"turns_per_s": 590.0 / 560.0, "host_cpu_ms_per_turn": 0.95, "harness_cpu_ms_per_turn": 0.61 / 0.64}
    )
    assert (every["rounds_new_cheaper"], every["rounds"]) == (2, 3)
    # Only round 1 had both runs at the machine's usual pace.
    steady = summary["steady"]
    assert steady["rounds"] == 1 and steady["rounds_new_cheaper"] == 1
    assert steady["ratios"]["host_cpu_ms_per_turn"] == pytest.approx(1.80 / 2.00)


def test_a_run_is_slow_for_the_share_of_its_samples_over_the_comparisons_fastest() -> None:
    runs = [_run(1, "new", 600.0, 1.8, 0.6, None), _run(1, "old", 560.0, 2.0, 0.6, None)]
    # Samples (when, ms): the fastest is 12.0 ms, so a sample over 15.6 ms is slow.
    timed = [(10.5, 12.0), (11.0, 20.0), (12.0, 13.0), (14.0, 12.5), (40.0, 30.0)]
    mark_slow(runs, timed)
    assert runs[0].slow_share == pytest.approx(1 / 4) and runs[1].slow_share == pytest.approx(1 / 4)
    # The window's median sample (12.75 ms) over the fastest.
    assert runs[0].pace_factor == pytest.approx(12.75 / 12.0)
    lonely = [_run(9, "new", 600.0, 1.8, 0.6, None)]
    mark_slow(lonely, timed)
    assert lonely[0].slow_share is None


def test_a_summary_of_one_tree_has_no_ratios() -> None:
    summary = summarize([_run(1, "new", 600.0, 1.8, 0.6, 0.0)])
    assert summary["all"]["ratios"] == {} and summary["all"]["rounds"] == 0
    assert summary["steady"]["rounds"] == 0


def test_the_old_tree_is_extracted_and_imported_ahead_of_the_installed_packages(tmp_path: Path) -> None:
    dirs = extract("HEAD", tmp_path / "tree")
    assert dirs == [str(tmp_path / "tree" / d) for d in ab.SOURCE_DIRS]
    for path in imported_from(dirs).values():
        assert path.startswith(str(tmp_path / "tree"))
    # Without them, the same probe finds the working tree.
    for path in imported_from(()).values():
        assert not path.startswith(str(tmp_path))


def test_a_revision_that_names_no_commit_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="names no commit"):
        extract("no-such-revision-anywhere", tmp_path)


def test_a_quick_run_against_head_measures_both_trees(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ab.json"
    assert ab.main(["HEAD", "--quick", "--out", str(out)]) == 0
    document = json.loads(out.read_text())
    assert [(r["round"], r["tree"]) for r in document["runs"]] == [(1, "new"), (1, "old")]
    for run in document["runs"]:
        assert run["turns_per_s"] > 0 and run["ended"] > run["began"]
        assert run["host_cpu_ms_per_turn"] > 0 and run["harness_cpu_ms_per_turn"] > 0
    ratios = document["all"]["ratios"]
    assert set(ratios) == {"turns_per_s", "host_cpu_ms_per_turn", "harness_cpu_ms_per_turn"}
    assert "all rounds, new / old: host CPU a turn" in capsys.readouterr().out
