"""A harness for the model round-trip benchmark, served out of process by the real SDK.

Each execution makes ``calls`` model calls through ``sink.model`` (the host journals MODEL_CALL,
runs its model, journals OUTPUT and replies) and writes each call's latency, in seconds, as a
JSON list to ``out``. The plan comes in the Start config: ``{"calls": N, "out": PATH}``.

Run as ``python -m bench.turn_harness --listen ADDR``; prints ``listening on ADDR`` once bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from agentsessions.sdk import EventSink, Start, text_message
from agentsessions.sdk.server import run_server
from agentsessions.v1 import common_pb2, harness_pb2


class ModelLoopHarness:
    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(
            id="bench-model-loop",
            version="1",
            models=["echo"],
            capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
        )

    async def run(self, start: Start, sink: EventSink) -> None:
        plan = json.loads(start.config)
        prompt = text_message("user", start.last_input_text())
        latencies: list[float] = []
        for _ in range(int(plan["calls"])):
            began = time.perf_counter()
            await sink.model(common_pb2.ModelCall(model="echo", messages=[prompt]))
            latencies.append(time.perf_counter() - began)
        await asyncio.to_thread(Path(plan["out"]).write_text, json.dumps(latencies))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.turn_harness")
    parser.add_argument("--listen", default="127.0.0.1:0")
    args = parser.parse_args(argv)
    run_server(ModelLoopHarness(), args.listen, on_ready=lambda a: print(f"listening on {a}", flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
