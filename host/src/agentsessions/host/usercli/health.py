"""``agentsessions health``: ask a host's ``grpc.health.v1.Health`` whether it serves.

Exit 0 when the answer is SERVING, 1 otherwise (NOT_SERVING while draining, an unknown service,
no answer within ``--timeout``, no host at all): the contract of a container HEALTHCHECK.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentsessions.host.usercli.connection import Connection, add_connection_arguments, environment
from agentsessions.host.usercli.errors import EXIT_FAILED, EXIT_OK, UsageError

DEFAULT_TIMEOUT_S = 5.0


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "health",
        help="check a host's grpc.health.v1 status (exit 0 serving, 1 not)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--service",
        default="",
        metavar="NAME",
        help="one service, for example agentsessions.v1.Sessions (default: the whole host)",
    )
    parser.add_argument("--quiet", "-q", action="store_true", help="print nothing, only the exit code")
    add_connection_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.timeout is None:
        args.timeout = DEFAULT_TIMEOUT_S
    try:
        connection = Connection.from_args(args, environment())
    except UsageError as exc:
        print(f"agentsessions health: {exc}", file=sys.stderr)
        return EXIT_FAILED
    status, detail = asyncio.run(_check(connection, args.service))
    if not args.quiet:
        target = f"{connection.server} {args.service}".rstrip()
        print(f"{target}: {status}{f' ({detail})' if detail else ''}")
    return EXIT_OK if status == "SERVING" else EXIT_FAILED


async def _check(connection: Connection, service: str) -> tuple[str, str]:
    async with connection.channel() as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = await stub.Check(
                health_pb2.HealthCheckRequest(service=service),
                metadata=connection.metadata,
                timeout=connection.timeout,
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code().name, exc.details() or ""
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)), ""
