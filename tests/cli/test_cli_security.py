"""The client commands over TLS and with bearer tokens, against a host that requires them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentsessions.host.config import HostConfig
from tests.cli.conftest import cli
from tests.security.conftest import PKI
from tests.support.certs import Authority
from tests.support.serving import serving

pytestmark = pytest.mark.e2e

TOKEN = "cli-test-token-0123456789"


def token_file(tmp_path: Path) -> str:
    path = tmp_path / "tokens.json"
    entry = {"principal": "user:alice", "projects": "*", "roles": ["writer", "approver"]}
    path.write_text(json.dumps({"tokens": {TOKEN: entry}}))
    return str(path)


@pytest.fixture
def pki(tmp_path: Path) -> PKI:
    ca = Authority(tmp_path, "ca")
    return PKI(ca, Authority(tmp_path, "rogue"), ca.server("host"), ca.server("harness"))


@pytest.fixture
async def tls_host(tmp_path: Path, pki: PKI) -> AsyncIterator[str]:
    config = HostConfig(
        listen="127.0.0.1:0",
        journal="memory:",
        log_level="warning",
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        auth_tokens=token_file(tmp_path),
    )
    async with serving(config) as addresses:
        yield addresses[0].replace("127.0.0.1", "localhost")


async def test_tls_with_the_token_from_the_environment(tls_host: str, pki: PKI) -> None:
    env = {"AGENTSESSIONS_TOKEN": TOKEN}
    created = await cli("create", "--tls-ca", pki.ca.cert, server=tls_host, env=env)
    assert created.code == 0, created
    ran = await cli(
        "exec", "-s", created.out.strip(), "--tls-ca", pki.ca.cert, "hi", server=tls_host, env=env
    )
    assert ran.code == 0 and ran.out == "> hi\necho:hi\n", ran


async def test_tls_with_the_token_from_a_file(tls_host: str, pki: PKI, tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    done = await cli("list", "--tls-ca", pki.ca.cert, "--token-file", str(secret), server=tls_host)
    assert done.code == 0, done


async def test_no_token_is_refused_unauthenticated(tls_host: str, pki: PKI) -> None:
    done = await cli("list", "--tls-ca", pki.ca.cert, server=tls_host)
    assert done.code == 3 and "UNAUTHENTICATED" in done.err, done


async def test_a_flag_token_wins_over_the_variable(tls_host: str, pki: PKI) -> None:
    env = {"AGENTSESSIONS_TOKEN": "not-the-right-token-at-all"}
    done = await cli("list", "--tls-ca", pki.ca.cert, "--token", TOKEN, server=tls_host, env=env)
    assert done.code == 0, done


async def test_a_host_from_another_ca_is_not_trusted(tls_host: str, pki: PKI) -> None:
    env = {"AGENTSESSIONS_TOKEN": TOKEN}
    done = await cli("list", "--tls-ca", pki.rogue.cert, "--timeout", "10", server=tls_host, env=env)
    assert done.code == 4 and "UNAVAILABLE" in done.err, done


async def test_health_needs_no_token(tls_host: str, pki: PKI) -> None:
    done = await cli("health", "--tls-ca", pki.ca.cert, server=tls_host)
    assert done.code == 0 and done.out.endswith("SERVING\n"), done


async def test_a_token_over_plaintext_rides_as_metadata(tmp_path: Path) -> None:
    config = HostConfig(
        listen="127.0.0.1:0", journal="memory:", log_level="warning", auth_tokens=token_file(tmp_path)
    )
    async with serving(config) as addresses:
        refused = await cli("list", server=addresses[0])
        allowed = await cli("list", server=addresses[0], env={"AGENTSESSIONS_TOKEN": TOKEN})
    assert refused.code == 3 and "UNAUTHENTICATED" in refused.err, refused
    assert allowed.code == 0, allowed


async def test_an_unreadable_ca_is_a_usage_error(tmp_path: Path) -> None:
    done = await cli("list", "--tls-ca", str(tmp_path / "missing.pem"), server="localhost:1")
    assert done.code == 2 and "TLS CA" in done.err, done
