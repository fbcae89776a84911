"""``--http-listen`` and ``AGENTSESSIONS_HTTP_LISTEN``: off by default, a TCP host:port of its own."""

from __future__ import annotations

import argparse
import asyncio
import socket

import pytest

from agentsessions.host import server
from agentsessions.host.app import StartupError
from agentsessions.host.config import ConfigError, HostConfig, add_arguments


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_off_by_default_and_read_from_flag_or_variable() -> None:
    assert HostConfig.from_sources(parsed(), {}).http_listen is None
    environ = {"AGENTSESSIONS_HTTP_LISTEN": "127.0.0.1:8080"}
    assert HostConfig.from_sources(parsed(), environ).http_listen == "127.0.0.1:8080"
    flag = parsed("--http-listen", "127.0.0.1:9090")
    assert HostConfig.from_sources(flag, environ).http_listen == "127.0.0.1:9090"


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ("unix:/tmp/web.sock", "must be host:port"),
        ("127.0.0.1", "needs host:port"),
        ("127.0.0.1:70000", "port '70000'"),
        ("127.0.0.1:50051", "must differ from --listen"),
        ("[::]:8080", "is not a loopback address"),
    ],
)
def test_bad_addresses_stop_startup_naming_the_flag(address: str, words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        HostConfig(http_listen=address)
    assert "--http-listen" in str(refused.value) and words in str(refused.value)


def test_port_zero_may_be_shared_with_listen() -> None:
    assert HostConfig(listen="127.0.0.1:0", http_listen="127.0.0.1:0").http_listen == "127.0.0.1:0"
    assert HostConfig(http_listen="[::1]:8080").http_listen == "[::1]:8080"


async def test_a_taken_http_port_stops_startup_naming_the_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = HostConfig(listen="127.0.0.1:0", journal="memory:", http_listen=f"127.0.0.1:{port}")
        with pytest.raises(StartupError) as refused:
            await server.serve(config, stop=asyncio.Event())
    assert f"cannot listen on 127.0.0.1:{port} (--http-listen)" in str(refused.value)
