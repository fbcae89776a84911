"""HTTPS on ``--http-listen`` with the listeners' own ``--tls-cert``/``--tls-key``; with
``--tls-client-ca`` the handshake refuses a client without a certificate from that CA, as on gRPC,
and the principal still comes from the bearer token."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import httpx
import pytest

from agentsessions.host.config import HostConfig
from tests.http.conftest import ALICE, bearer
from tests.support.certs import Authority
from tests.support.serving import serving


def client_context(ca: Authority, cert: str | None = None, key: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca.cert)
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


async def test_https_with_the_listeners_certificate(tmp_path: Path) -> None:
    ca = Authority(tmp_path, "ca")
    issued = ca.server("host")
    config = HostConfig(
        listen="127.0.0.1:0",
        journal="memory:",
        http_listen="127.0.0.1:0",
        tls_cert=issued.cert,
        tls_key=issued.key,
    )
    async with serving(config) as addresses:
        base = f"https://{addresses[-1]}"
        async with httpx.AsyncClient(base_url=base, verify=client_context(ca)) as client:
            answer = await client.post("/api/v1/sessions", json={"session": {}})
            assert answer.status_code == 200, answer.text
            # The Origin of a page served over https is https://...: the same origin.
            own = await client.get("/api/v1/sessions", headers={"Origin": base})
            assert own.status_code == 200
        async with httpx.AsyncClient(base_url=f"http://{addresses[-1]}") as plain:
            with pytest.raises(httpx.HTTPError):
                await plain.get("/healthz")


async def test_mutual_tls_refuses_a_client_without_a_certificate(tmp_path: Path) -> None:
    ca = Authority(tmp_path, "ca")
    issued = ca.server("host")
    tokens = tmp_path / "principals.json"
    principal = {"principal": "user:alice", "projects": "*", "roles": ["writer"]}
    tokens.write_text(json.dumps({"tokens": {ALICE: principal}}))
    config = HostConfig(
        listen="127.0.0.1:0",
        journal="memory:",
        http_listen="127.0.0.1:0",
        tls_cert=issued.cert,
        tls_key=issued.key,
        tls_client_ca=ca.cert,
        auth_tokens=str(tokens),
    )
    me = ca.client("console")
    async with serving(config) as addresses:
        base = f"https://{addresses[-1]}"
        async with httpx.AsyncClient(base_url=base, verify=client_context(ca)) as stranger:
            with pytest.raises(httpx.HTTPError):
                await stranger.get("/healthz")
        context = client_context(ca, me.cert, me.key)
        async with httpx.AsyncClient(base_url=base, verify=context) as client:
            assert (await client.get("/healthz")).status_code == 200
            # The certificate opens the connection; the token names the principal.
            anonymous = await client.get("/api/v1/sessions")
            assert anonymous.status_code == 401
            assert (await client.get("/api/v1/sessions", headers=bearer(ALICE))).status_code == 200
