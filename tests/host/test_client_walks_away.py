"""A client that walks away from a running Exec must not crash the host when it stops.

Run in a child process: the failure this guards against was a segmentation fault in grpc's C
core (the access log read the call's context after the server had released the call).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import asyncio
    from grpc import aio
    from agentsessions.host.config import HostConfig
    from agentsessions.host.server import serve
    from agentsessions.sdk.harness import text_message
    from agentsessions.v1 import session_pb2, session_pb2_grpc

    async def main() -> None:
        stop = asyncio.Event()
        ready: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        config = HostConfig(listen="127.0.0.1:0", journal="memory:", log_level="error")
        host = asyncio.create_task(serve(config, stop=stop, on_serving=lambda a: ready.set_result(list(a))))
        (address,) = await asyncio.wait_for(ready, 60)
        async with aio.insecure_channel(address) as channel:
            call = session_pb2_grpc.SessionsStub(channel).Exec(
                session_pb2.ExecRequest(inputs=[text_message("user", "hi")])
            )
            await call.read()  # the session frame only; then the client goes away
        stop.set()
        assert await asyncio.wait_for(host, 60) == 0
        print("host stopped cleanly")

    asyncio.run(main())
    """
)


def test_host_stops_cleanly_after_a_client_abandons_an_exec() -> None:
    for _ in range(3):  # the crash was timing-dependent: give it several chances
        done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
        assert "host stopped cleanly" in done.stdout
