"""The echo harness: one model call with the last input, as the reference host's default.

Serve it on its own: ``python -m agentsessions.harnesses.echo --listen 127.0.0.1:50061``.
"""

from __future__ import annotations

import sys

from agentsessions.sdk import Execution, HarnessDescriptor, Message, NativeHarness
from agentsessions.sdk.cli import serve_main


class EchoHarness(NativeHarness):
    """Asks the host's model to answer the last input; the embedded echo model returns "echo:" + it."""

    descriptor = HarnessDescriptor(id="echo", version="1", models=("echo",))

    async def execute(self, ex: Execution) -> None:
        await ex.model([Message.user(ex.input_text())], model="echo")


if __name__ == "__main__":
    sys.exit(serve_main(EchoHarness(), prog="python -m agentsessions.harnesses.echo"))
