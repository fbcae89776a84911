"""The journal benchmark's single-session figures: the goals' pass commits on the event loop's
thread, as the host's controller has its store do while at most one execution runs; the control
pass hands every COMMIT to the writer's thread. Both leave the session's chain whole."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from agentsessions.host.journal import sqlite as sqlite_store
from agentsessions.host.journal.store import JournalStore
from bench import journal


async def test_the_single_session_figures_come_from_both_commit_paths(tmp_path: Path) -> None:
    sizes = journal.QUICK
    backend = journal.sqlite_backend(tmp_path)
    inline_jobs: list[int] = []
    open_store = backend.open

    async def open_and_watch() -> JournalStore:
        store = await open_store()
        dialect = store._dialect  # type: ignore[attr-defined]
        assert isinstance(dialect, sqlite_store._SqliteDialect)
        switch = store.work_inline_while

        def switched(quiet: object) -> None:
            # How many COMMITs had run on the loop's thread when the pass before this one ended.
            inline_jobs.append(dialect.writer.inline_jobs)
            switch(quiet)  # type: ignore[arg-type]

        close = store.close

        async def closing() -> None:
            inline_jobs.append(dialect.writer.inline_jobs)
            await close()

        store.work_inline_while = switched  # type: ignore[method-assign]
        store.close = closing  # type: ignore[method-assign]
        return store

    backend = dataclasses.replace(backend, open=open_and_watch, cleanup=_keep)
    report = journal.Report(sizes=sizes)
    await journal.measure_backend(backend, sizes, report)

    figures = report.results["sqlite"]
    for suffix in ("", "_writer_thread"):
        assert figures[f"append_1_session{suffix}_time_vs_raw_commit_x"] > 0
        assert figures[f"create_session{suffix}_time_vs_raw_commit_x"] > 0
        assert figures[f"append_1_session{suffix}_events_s"] > 0
    ratios = journal.ratios(report)["sqlite"]
    assert ratios["append_1_session_writer_thread_time_vs_raw_commit_x"] is not None
    goal_metrics = {g["metric"] for g in journal.goals(report) if g["backend"] == "sqlite"}
    assert "append_1_session_time_vs_raw_commit_x" in goal_metrics
    assert not any("writer_thread" in m for m in goal_metrics)

    # The first store opened measured both passes (and was closed before the next opened): every
    # append and create of the first pass committed on the loop's thread, none of the second's.
    first_pass, second_pass, closed = inline_jobs[:3]
    assert second_pass - first_pass >= sizes.single_session_appends + sizes.create_sessions
    assert closed == second_pass
    # One chain through both passes.
    store = await sqlite_store.SqliteStore.open(tmp_path / "store-0.db")
    try:
        records = await store.read("one")
        assert [r.seq for r in records] == list(range(1, 2 * sizes.single_session_appends + 1))
        assert await store.verify("one") == 2 * sizes.single_session_appends
    finally:
        await store.close()


async def _keep() -> None:
    """The stores' files stay for the test to read back; its directory goes with the test."""
