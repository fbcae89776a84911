"""Limits every agentsessions.v1 server and channel shares (harness servers, the host's harness
link, the Sessions client), so both ends of a stream agree on them."""

from __future__ import annotations

# Histories and completions can be large; gRPC's 4 MiB default would cut long sessions off.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

# Channel and server options that raise gRPC's message size limits to MAX_MESSAGE_BYTES.
MESSAGE_SIZE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)
