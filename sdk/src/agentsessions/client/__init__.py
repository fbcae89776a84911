"""Async Python client for ``agentsessions.v1.Sessions`` (thin: grpcio + protobuf only).

async with SessionsClient.connect("127.0.0.1:50051") as client:
    session = await client.create_session(harness="echo")
    async for update in client.exec(session.metadata.uid, "hi"):
        ...
"""

from agentsessions.client.credentials import bearer_metadata, tls_credentials
from agentsessions.client.sessions import SessionsClient
from agentsessions.sdk.harness import text_message

__all__ = ["SessionsClient", "bearer_metadata", "text_message", "tls_credentials"]
