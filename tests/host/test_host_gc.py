"""`agentsessions serve` tunes the collector for a host process (server.collect_garbage_for_serving)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

from agentsessions.host import server


def test_a_serving_process_collects_its_young_objects_less_often() -> None:
    before = gc.get_threshold()
    try:
        server.collect_garbage_for_serving()
        young, middle, oldest = gc.get_threshold()
        assert young == server.GC_YOUNG_THRESHOLD > before[0]
        assert middle == server.GC_MIDDLE_THRESHOLD and oldest == before[2]
        # What the process had loaded is out of the collector's sight from then on.
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_serve_applies_it_before_the_loop_starts() -> None:
    """Through the real entry point: the threshold is set in the process that serves."""
    probe = (
        "import gc, sys\n"
        "from agentsessions.host import server\n"
        "async def fake(config, **kw):\n"
        "    print(gc.isenabled(), gc.get_freeze_count() > 10000, gc.get_threshold()[0]); return 0\n"
        "server.serve = fake\n"
        "from agentsessions.host import cli\n"
        "sys.exit(cli.main(['serve', '--journal', 'memory:', '--listen', '127.0.0.1:0']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env={**os.environ}
    )
    assert done.returncode == 0, done.stderr
    # Collecting again (it is paused while the command's modules load, cli._parsed), with the
    # modules loaded by then frozen and the young threshold raised.
    assert done.stdout.strip().splitlines()[-1] == f"True True {server.GC_YOUNG_THRESHOLD}"
