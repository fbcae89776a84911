"""The ``agentsessions-harness`` command: serve any harness over ``Harness.Connect``.

    agentsessions-harness serve my_package.agent:MyHarness --listen 127.0.0.1:50061

The target is ``module:attribute``; a class or zero-argument factory is called, an object with
``describe`` and ``run`` is served as is. The module is imported with ``--app-dir`` (default: the
current directory) first on the import path, so ``my_echo:MyEcho`` works from the folder holding
``my_echo.py``, as with uvicorn. Once bound, one line ``listening on ADDRESS`` goes to
stdout (so ``--listen 127.0.0.1:0`` reports the port it picked). ``--tls-cert``/``--tls-key`` serve
TLS; ``--tls-client-ca`` also requires client certificates from that CA (mutual TLS).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from agentsessions.sdk.grpcenv import choose_transport
from agentsessions.sdk.harness import Harness

if TYPE_CHECKING:
    from agentsessions.sdk.tls import ServerTLS


class TargetError(Exception):
    """The serve target cannot be loaded as a harness."""


def load_harness(target: str) -> Harness:
    """Import ``module:attribute`` and turn it into a harness object."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise TargetError(f"target {target!r} must be module:attribute, e.g. mypkg.agent:MyHarness")
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise TargetError(f"cannot import {module_name!r}: {exc}") from exc
    for name in attribute.split("."):
        try:
            obj = getattr(obj, name)
        except AttributeError:
            raise TargetError(f"{module_name!r} has no attribute {attribute!r}") from None
    # A class passes the protocol check through its methods, so build it first.
    if isinstance(obj, type) or (callable(obj) and not isinstance(obj, Harness)):
        try:
            obj = obj()
        except Exception as exc:
            raise TargetError(f"{target} could not be constructed without arguments: {exc}") from exc
    if not isinstance(obj, Harness):
        raise TargetError(f"{target} is not a harness (it needs async describe() and run(start, sink))")
    return obj


def _announce(address: str) -> None:
    print(f"listening on {address}", flush=True)


def _add_listen(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        required=True,
        metavar="ADDR",
        help="host:port (port 0 picks a free one) or unix:path",
    )
    parser.add_argument("--grace", type=float, default=5.0, help="seconds to finish streams on shutdown")
    parser.add_argument(
        "--stop-on-stdin-eof",
        action="store_true",
        help="stop (as on SIGTERM) once standard input reaches end of file: a process that starts "
        "this one and holds the other end of a pipe makes it stop when it goes away, even by SIGKILL",
    )
    parser.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate chain")
    parser.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    parser.add_argument(
        "--tls-client-ca",
        metavar="PEM",
        help="require client certificates that chain to this CA (mutual TLS; needs --tls-cert)",
    )


def _tls(parser: argparse.ArgumentParser, args: argparse.Namespace) -> ServerTLS | None:
    from agentsessions.sdk.tls import ServerTLS

    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            parser.error("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        parser.error("--tls-cert and --tls-key go together")
    return ServerTLS(args.tls_cert, args.tls_key, args.tls_client_ca)


def serve_main(harness: Harness, argv: Sequence[str] | None = None, *, prog: str | None = None) -> int:
    """A ``__main__`` for one harness: ``python -m mypkg.agent --listen ADDR``."""
    choose_transport()  # in time only if nothing imported grpc yet (agentsessions.sdk.grpcenv)
    parser = argparse.ArgumentParser(prog=prog, description="Serve a harness over Harness.Connect.")
    _add_listen(parser)
    args = parser.parse_args(argv)
    return _serve(harness, args, _tls(parser, args))


def _serve(harness: Harness, args: argparse.Namespace, tls: ServerTLS | None) -> int:
    # grpc loads here, not at this module's import: main() chooses its transport first.
    from agentsessions.sdk.server import run_server
    from agentsessions.sdk.tls import TLSFilesError

    try:
        run_server(
            harness,
            args.listen,
            grace=args.grace,
            on_ready=_announce,
            tls=tls,
            stop_on_stdin_eof=args.stop_on_stdin_eof,
        )
    except (OSError, TLSFilesError) as exc:
        print(f"agentsessions-harness: {exc}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentsessions-harness", description="Serve harnesses for agentsessions.v1."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve one harness over Harness.Connect")
    serve.add_argument("target", help="module:attribute naming the harness class, factory or object")
    serve.add_argument(
        "--app-dir",
        default=".",
        metavar="DIR",
        help="put DIR first on the import path before importing the target (default: the current directory)",
    )
    _add_listen(serve)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    choose_transport()
    parser = build_parser()
    args = parser.parse_args(argv)
    tls = _tls(parser, args)
    app_dir = os.path.abspath(args.app_dir)
    if app_dir not in sys.path:
        sys.path.insert(0, app_dir)
    try:
        harness = load_harness(args.target)
    except TargetError as exc:
        print(f"agentsessions-harness: {exc}", file=sys.stderr)
        return 1
    return _serve(harness, args, tls)


if __name__ == "__main__":
    sys.exit(main())
