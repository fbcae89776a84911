"""The names this module held before the server was split into ``sink`` (the stream sink's state
machine), ``servicer`` (``agentsessions.v1.Harness``) and ``serving`` (server lifecycle); kept so
existing imports keep working."""

from agentsessions.sdk.servicer import HarnessServicer, start_from_frame
from agentsessions.sdk.serving import (
    GRPC_OPTIONS,
    MAX_MESSAGE_BYTES,
    HarnessServer,
    run_server,
    serve,
    start_server,
)
from agentsessions.sdk.sink import StreamSink

__all__ = [
    "GRPC_OPTIONS",
    "MAX_MESSAGE_BYTES",
    "HarnessServer",
    "HarnessServicer",
    "StreamSink",
    "run_server",
    "serve",
    "start_from_frame",
    "start_server",
]
