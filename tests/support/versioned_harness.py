"""A harness process whose version is whatever the file ``harness-version`` in its working directory
said when the process started, served as ``tests.support.versioned_harness:VersionedHarness``: a test
"upgrades" the harness by stopping the process, rewriting the file and starting it again."""

from __future__ import annotations

from pathlib import Path

from agentsessions.sdk import EventSink, Start
from agentsessions.v1 import harness_pb2

VERSION_FILE = "harness-version"


class VersionedHarness:
    def __init__(self) -> None:
        self.version = Path(VERSION_FILE).read_text(encoding="utf-8").strip()

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(
            id="versioned",
            version=self.version,
            capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
        )

    async def run(self, start: Start, sink: EventSink) -> None:
        await sink.output(f"version {self.version}")
