"""Channel credentials for :meth:`SessionsClient.connect`, built from PEM files.

    credentials = tls_credentials(ca_file="ca.pem", cert_file="me.pem", key_file="me-key.pem",
                                  token=os.environ["AGENTSESSIONS_TOKEN"])
    async with SessionsClient.connect("host.example:50051", credentials=credentials) as client:
        ...

``ca_file`` verifies the host (system roots when omitted); ``cert_file``/``key_file`` present a client
certificate (mutual TLS); ``token`` sends ``authorization: Bearer <token>`` on every call (gRPC sends
call credentials over TLS only). Over a plaintext loopback channel pass ``metadata=bearer_metadata(t)``
to ``connect`` instead.
"""

from __future__ import annotations

import grpc

from agentsessions.sdk.tls import ClientTLS

__all__ = ["bearer_metadata", "tls_credentials"]


def tls_credentials(
    *,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    token: str | None = None,
) -> grpc.ChannelCredentials:
    """TLS (or mutual TLS) channel credentials, with a bearer token on every call when given."""
    credentials = ClientTLS(ca_file, cert_file, key_file).credentials()
    if token:
        return grpc.composite_channel_credentials(credentials, grpc.access_token_call_credentials(token))
    return credentials


def bearer_metadata(token: str) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying ``token`` as ``authorization: Bearer <token>``."""
    return (("authorization", f"Bearer {token}"),)
