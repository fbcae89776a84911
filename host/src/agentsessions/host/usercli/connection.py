"""How a client command reaches the host: ``--server``, TLS and the bearer token.

The options mirror the Python client (``agentsessions.client``): plaintext by default; ``--tls``
(system roots) or ``--tls-ca`` to verify the host; ``--tls-cert``/``--tls-key`` for mutual TLS; a
token from ``--token-file``, else ``AGENTSESSIONS_TOKEN``, else ``--token``. Over TLS the token
rides as call credentials; over plaintext (a loopback host) as ``authorization`` metadata.
``--server`` defaults to ``AGENTSESSIONS_SERVER``, else ``127.0.0.1:50051``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

import grpc
from grpc import aio

from agentsessions.client import SessionsClient, bearer_metadata, tls_credentials
from agentsessions.host.usercli.errors import UsageError
from agentsessions.sdk.structs import struct
from agentsessions.sdk.tls import TLSFilesError, open_channel

SERVER_ENV = "AGENTSESSIONS_SERVER"
TOKEN_ENV = "AGENTSESSIONS_TOKEN"
DEFAULT_SERVER = "127.0.0.1:50051"
DEFAULT_TIMEOUT_S = 30.0


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection")
    group.add_argument(
        "--server",
        metavar="ADDR",
        help=f"host address, host:port or unix:path (env {SERVER_ENV}; default {DEFAULT_SERVER})",
    )
    group.add_argument("--tls", action="store_true", help="TLS, verifying the host with the system roots")
    group.add_argument("--tls-ca", metavar="PEM", help="TLS, verifying the host with this CA")
    group.add_argument("--tls-cert", metavar="PEM", help="client certificate for mutual TLS")
    group.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    group.add_argument(
        "--token",
        metavar="TOKEN",
        help=f"bearer token; prefer {TOKEN_ENV} or --token-file, which stay out of the process list",
    )
    group.add_argument("--token-file", metavar="FILE", help="file holding the bearer token")
    group.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=float,
        help=f"deadline of each unary call (default {DEFAULT_TIMEOUT_S:g}); streams (exec, log, verify) "
        "run until done unless it is given",
    )


@struct(frozen=True)
class Connection:
    """A resolved ``--server`` with its credentials."""

    server: str
    credentials: grpc.ChannelCredentials | None
    metadata: tuple[tuple[str, str], ...]
    timeout: float
    stream_timeout: float | None

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str]) -> Connection:
        server = args.server or environ.get(SERVER_ENV, "") or DEFAULT_SERVER
        token = _token(args, environ)
        if (args.tls_cert is None) != (args.tls_key is None):
            raise UsageError("--tls-cert and --tls-key go together")
        secure = bool(args.tls or args.tls_ca or args.tls_cert)
        credentials = None
        metadata: tuple[tuple[str, str], ...] = ()
        if secure:
            try:
                credentials = tls_credentials(
                    ca_file=args.tls_ca, cert_file=args.tls_cert, key_file=args.tls_key, token=token or None
                )
            except TLSFilesError as exc:
                raise UsageError(str(exc)) from None
        elif token:
            metadata = bearer_metadata(token)
        if args.timeout is not None and not args.timeout > 0:
            raise UsageError(f"--timeout {args.timeout:g} must be a positive number of seconds")
        return cls(
            server=server,
            credentials=credentials,
            metadata=metadata,
            timeout=args.timeout or DEFAULT_TIMEOUT_S,
            stream_timeout=args.timeout,
        )

    def sessions(self) -> SessionsClient:
        return SessionsClient.connect(self.server, credentials=self.credentials, metadata=self.metadata)

    def channel(self) -> aio.Channel:
        return open_channel(self.server, self.credentials)


def _token(args: argparse.Namespace, environ: Mapping[str, str]) -> str:
    if args.token_file:
        try:
            token = Path(args.token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise UsageError(
                f"--token-file {args.token_file!r} cannot be read: {exc.strerror or exc}"
            ) from None
        if not token:
            raise UsageError(f"--token-file {args.token_file!r} is empty")
        return token
    return str(args.token or environ.get(TOKEN_ENV, "") or "")


def environment() -> Mapping[str, str]:
    return os.environ
