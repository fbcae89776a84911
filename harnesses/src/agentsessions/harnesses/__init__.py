"""Ready harnesses for agentsessions.v1: ``echo`` and ``chat``.

Each is a plain :class:`agentsessions.sdk.Harness`; run one in its own process with
``agentsessions-harness serve agentsessions.harnesses.echo:EchoHarness --listen ADDR``.
"""
