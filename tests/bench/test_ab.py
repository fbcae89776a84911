"""``bench.ab``: two trees of the host alternated. Its summary from runs, the old tree's sources
taken from the repository (and imported ahead of the installed packages), and a smoke run against
HEAD with real processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import ab
from bench.ab import Run, extract, imported_from, summarize


def test_the_summary_takes_medians_their_ratios_and_the_rounds_the_new_tree_spent_less() -> None:
    runs = [
        Run("new", 600.0, 1.80, 0.60, 12.5),
        Run("old", 560.0, 2.00, 0.62, 12.6),
        Run("old", 500.0, 2.10, 0.66, 13.0),
        Run("new", 480.0, 2.20, 0.70, 13.1),  # a slow spell: the new tree spent more this round
        Run("new", 590.0, 1.90, 0.61, 12.4),
        Run("old", 570.0, 1.95, 0.64, 12.5),
    ]
    summary = summarize(runs)
    assert summary["medians"] == {
        "new": {"turns_per_s": 590.0, "host_cpu_ms_per_turn": 1.90, "harness_cpu_ms_per_turn": 0.61},
        "old": {"turns_per_s": 560.0, "host_cpu_ms_per_turn": 2.00, "harness_cpu_ms_per_turn": 0.64},
    }
    assert summary["ratios"] == pytest.approx(
        {"turns_per_s": 590.0 / 560.0, "host_cpu_ms_per_turn": 0.95, "harness_cpu_ms_per_turn": 0.61 / 0.64}
    )
    assert (summary["rounds_new_cheaper"], summary["rounds"]) == (2, 3)


def test_a_summary_of_one_tree_has_no_ratios() -> None:
    summary = summarize([Run("new", 600.0, 1.8, 0.6, 12.5)])
    assert summary["ratios"] == {} and summary["rounds"] == 0


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
    assert [r["tree"] for r in document["runs"]] == ["new", "old"]
    for run in document["runs"]:
        assert run["turns_per_s"] > 0 and run["pace_ms"] > 0
        assert run["host_cpu_ms_per_turn"] > 0 and run["harness_cpu_ms_per_turn"] > 0
    assert set(document["ratios"]) == {"turns_per_s", "host_cpu_ms_per_turn", "harness_cpu_ms_per_turn"}
    assert "new / old: host CPU a turn" in capsys.readouterr().out
