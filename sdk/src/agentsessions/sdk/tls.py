"""TLS and mutual TLS for every agentsessions.v1 listener and channel: one factory per side.

Servers (the host's Sessions and registry listeners, a harness's ``serve``) bind through
:func:`add_port` with a :class:`ServerTLS` (certificate, key, and optionally the CA that client
certificates must chain to, which turns on mTLS); without one they listen in plaintext. Channels
(the host dialling a harness, a Sessions client) open through :func:`open_channel` with
credentials from :class:`ClientTLS` (the CA that verifies the server, and optionally the client's own
certificate and key for mTLS), or plaintext without them.

Files are PEM. A file that cannot be read, or does not hold what it should, raises
:class:`TLSFilesError` naming the file and its role, so a misconfigured process stops at startup.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc import aio

from agentsessions.sdk.structs import struct

__all__ = ["ClientTLS", "ServerTLS", "TLSFilesError", "add_port", "open_channel"]

_PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
_PEM_PRIVATE_KEY = b"PRIVATE KEY-----"

ChannelOptions = Sequence[tuple[str, int | str]]


class TLSFilesError(ValueError):
    """A TLS file is missing, unreadable, or not the PEM it should be; the message names it."""


def _read(path: str, role: str, marker: bytes) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TLSFilesError(f"{role} {path!r} cannot be read: {exc.strerror or exc}") from None
    if marker not in data:
        kind = "certificate" if marker == _PEM_CERTIFICATE else "private key"
        raise TLSFilesError(f"{role} {path!r} holds no PEM {kind}")
    return data


@struct(frozen=True)
class ServerTLS:
    """A listener's certificate chain and key; with ``client_ca_file`` clients must present a
    certificate that chains to it (mutual TLS), and calls without one are refused in the handshake."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    @property
    def mutual(self) -> bool:
        return self.client_ca_file is not None

    def credentials(self) -> grpc.ServerCredentials:
        cert = _read(self.cert_file, "TLS certificate", _PEM_CERTIFICATE)
        key = _read(self.key_file, "TLS key", _PEM_PRIVATE_KEY)
        client_ca = None
        if self.client_ca_file is not None:
            client_ca = _read(self.client_ca_file, "TLS client CA", _PEM_CERTIFICATE)
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
        )


@struct(frozen=True)
class ClientTLS:
    """How a channel verifies its server (``ca_file``, else the system roots) and, for mutual
    TLS, the client's own certificate chain and key (both or neither)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise TLSFilesError("a client certificate needs its key, and a key its certificate")

    @property
    def mutual(self) -> bool:
        return self.cert_file is not None

    def credentials(self) -> grpc.ChannelCredentials:
        ca = _read(self.ca_file, "TLS CA", _PEM_CERTIFICATE) if self.ca_file else None
        cert = key = None
        if self.cert_file is not None and self.key_file is not None:
            cert = _read(self.cert_file, "TLS client certificate", _PEM_CERTIFICATE)
            key = _read(self.key_file, "TLS client key", _PEM_PRIVATE_KEY)
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def add_port(server: aio.Server, address: str, tls: ServerTLS | None) -> int:
    """Bind ``address`` on ``server`` (TLS when ``tls`` is given); returns the bound port.

    Raises :class:`TLSFilesError` for unusable TLS files and ``RuntimeError`` when the address
    cannot be bound.
    """
    port: int
    if tls is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, tls.credentials())
    return port


def open_channel(
    target: str,
    credentials: grpc.ChannelCredentials | None,
    options: ChannelOptions = (),
) -> aio.Channel:
    """An aio channel to ``target``: TLS with ``credentials``, plaintext without."""
    if credentials is None:
        return aio.insecure_channel(target, options=options)
    return aio.secure_channel(target, credentials, options=options)
