"""The gRPC transport the ``agentsessions`` and ``agentsessions-harness`` commands run on.

Since grpcio 1.80, gRPC core moves a Python process's TCP connections through its EventEngine:
every read and write of a socket runs on one of the engine's own threads (``event_engine`` in
``/proc/<pid>/task/*/comm``), which hands the result to the completion queue that grpc.aio's
poller thread watches, which wakes the event loop. Its ``event_engine_client`` and
``event_engine_listener`` experiments switched off, connections go back to gRPC core's
long-standing I/O manager, whose poller thread reads and writes the sockets itself: one thread
hop fewer for each message. On this project's turn benchmark (bench/NOTEBOOK.md, "The transport
the commands choose") that took the host's CPU a turn down by 5-12% at 32 sessions and the echo
harness's by 7-13%, and the turns a second up by up to ~10% (noisy: one A/B of five went 5% the
other way).

gRPC core reads ``GRPC_EXPERIMENTS`` once, when ``grpc`` is first imported, so the choice is made
by :func:`choose_transport` at the very start of each command, before anything imports grpc, and
is inherited by the processes the host starts (its built-in harnesses). An environment that
already sets ``GRPC_EXPERIMENTS`` (even to an empty value, which keeps grpcio's defaults) is left
as it is: the operator's setting wins. ``serve_main`` (the built-in harnesses' ``python -m``
entry points) calls it too, in time when nothing imported grpc before it; a program that serves a
harness itself (:func:`agentsessions.sdk.run_server`) can call :func:`choose_transport` before its
first ``import grpc``, or export the same variable.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import Final

VARIABLE: Final = "GRPC_EXPERIMENTS"
# gRPC core's experiment names, each prefixed "-" (off); tests/sdk/test_grpcenv.py checks that the
# installed grpcio still knows them (it logs "Unknown experiment" for a name it does not).
LEGACY_IO: Final = "-event_engine_client,-event_engine_listener"


def choose_transport(
    environ: MutableMapping[str, str] | None = None, modules: Mapping[str, object] | None = None
) -> str | None:
    """Set ``GRPC_EXPERIMENTS`` to :data:`LEGACY_IO` unless the environment sets it already or
    grpc is already imported (too late to matter); returns the value set, or None."""
    env = os.environ if environ is None else environ
    loaded = sys.modules if modules is None else modules
    if VARIABLE in env or "grpc" in loaded:
        return None
    env[VARIABLE] = LEGACY_IO
    return LEGACY_IO
