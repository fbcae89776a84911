"""The echo harness: one model call with the last input, as the reference host's default.

Serve it on its own: ``python -m agentsessions.harnesses.echo --listen 127.0.0.1:50061``.
"""

from __future__ import annotations

import sys

from agentsessions.sdk import EventSink, Start, text_message
from agentsessions.sdk.cli import serve_main
from agentsessions.v1 import common_pb2, harness_pb2


class EchoHarness:
    """Asks the host's model to answer the last input; the embedded echo model returns "echo:" + it."""

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(
            id="echo",
            version="1",
            models=["echo"],
            capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
        )

    async def run(self, start: Start, sink: EventSink) -> None:
        prompt = text_message("user", start.last_input_text())
        await sink.model(common_pb2.ModelCall(model="echo", messages=[prompt]))


if __name__ == "__main__":
    sys.exit(serve_main(EchoHarness(), prog="python -m agentsessions.harnesses.echo"))
