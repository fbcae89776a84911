"""TLS and mutual TLS over loopback: the Sessions and registry listeners, the host dialling
harnesses, a harness's ``serve``, and the refusals (plaintext, no client certificate, wrong CA)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import grpc
import pytest

from agentsessions.client import SessionsClient, tls_credentials
from agentsessions.harnesses.echo import EchoHarness
from agentsessions.host.app import StartupError
from agentsessions.host.config import ConfigError, HostConfig
from agentsessions.host.harnesslink import HarnessUnavailableError, RemoteHarness
from agentsessions.sdk import cli as harness_cli
from agentsessions.sdk.server import start_server
from agentsessions.sdk.tls import ClientTLS, ServerTLS, TLSFilesError, open_channel
from agentsessions.v1 import common_pb2, harness_registry_pb2, harness_registry_pb2_grpc
from tests.security.conftest import PKI
from tests.support.processes import free_port, harness_process, serve_argv
from tests.support.serving import serving

ROOT = Path(__file__).resolve().parents[2]
MEMORY = "memory:"


async def echo_turn(client: SessionsClient, harness: str = "echo") -> str:
    """Create a session, run one turn with input "hi", return the OUTPUT text."""
    session = await client.create_session(harness=harness)
    texts = [
        "".join(p.text.text for p in u.record.event.message.parts)
        async for u in client.exec(session.metadata.uid, "hi")
        if u.HasField("record") and u.record.event.kind == common_pb2.EVENT_OUTPUT
    ]
    return texts[-1]


async def refused(client: SessionsClient) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.create_session()
    return caught.value.code()


def tls_config(pki: PKI, *, tls_client_ca: str | None = None, registry_addr: str | None = None) -> HostConfig:
    return HostConfig(
        listen="127.0.0.1:0",
        journal=MEMORY,
        tls_cert=pki.server.cert,
        tls_key=pki.server.key,
        tls_client_ca=tls_client_ca,
        registry_addr=registry_addr,
    )


async def test_sessions_listener_serves_tls_and_refuses_plaintext_and_an_untrusted_ca(pki: PKI) -> None:
    async with serving(tls_config(pki)) as (address,):
        async with SessionsClient.connect(address, credentials=tls_credentials(ca_file=pki.ca.cert)) as ok:
            assert await echo_turn(ok) == "echo:hi"
        async with SessionsClient.connect(address) as plaintext:
            assert await refused(plaintext) == grpc.StatusCode.UNAVAILABLE
        untrusting = tls_credentials(ca_file=pki.rogue.cert)
        async with SessionsClient.connect(address, credentials=untrusting) as wrong_ca:
            assert await refused(wrong_ca) == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_requires_a_client_certificate_from_the_client_ca(pki: PKI) -> None:
    alice = pki.client("alice")
    stranger = pki.rogue.client("alice")
    async with serving(tls_config(pki, tls_client_ca=pki.ca.cert)) as (address,):
        good = tls_credentials(ca_file=pki.ca.cert, cert_file=alice.cert, key_file=alice.key)
        async with SessionsClient.connect(address, credentials=good) as client:
            assert await echo_turn(client) == "echo:hi"
        no_cert = tls_credentials(ca_file=pki.ca.cert)
        async with SessionsClient.connect(address, credentials=no_cert) as client:
            assert await refused(client) == grpc.StatusCode.UNAVAILABLE
        wrong_ca = tls_credentials(ca_file=pki.ca.cert, cert_file=stranger.cert, key_file=stranger.key)
        async with SessionsClient.connect(address, credentials=wrong_ca) as client:
            assert await refused(client) == grpc.StatusCode.UNAVAILABLE


async def test_registry_listener_serves_the_same_mutual_tls(pki: PKI) -> None:
    alice = pki.client("alice")
    registry_addr = f"127.0.0.1:{free_port()}"
    config = tls_config(pki, tls_client_ca=pki.ca.cert, registry_addr=registry_addr)
    request = harness_registry_pb2.ListHarnessesRequest()
    async with serving(config) as (_, registry):
        good = ClientTLS(pki.ca.cert, alice.cert, alice.key).credentials()
        async with open_channel(registry, good) as channel:
            listed = await harness_registry_pb2_grpc.HarnessRegistryStub(channel).ListHarnesses(request)
            assert "echo" in [h.metadata.name for h in listed.harnesses]
        async with open_channel(registry, ClientTLS(pki.ca.cert).credentials()) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await harness_registry_pb2_grpc.HarnessRegistryStub(channel).ListHarnesses(request)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_host_dials_a_harness_over_mutual_tls(pki: PKI) -> None:
    host_client = pki.client("agentsessions-host")
    harness_tls = ServerTLS(pki.harness.cert, pki.harness.key, client_ca_file=pki.ca.cert)
    harness = await start_server(EchoHarness(), "127.0.0.1:0", tls=harness_tls)
    try:
        dialling = HostConfig(
            listen="127.0.0.1:0",
            journal=MEMORY,
            harnesses=[("remote", harness.address)],
            harness_tls_ca=pki.ca.cert,
            harness_tls_cert=host_client.cert,
            harness_tls_key=host_client.key,
        )
        async with serving(dialling) as (address,), SessionsClient.connect(address) as client:
            assert await echo_turn(client, "remote") == "echo:hi"

        # Without its client certificate, or in plaintext, the host cannot reach the harness.
        for config in (
            HostConfig(
                listen="127.0.0.1:0",
                journal=MEMORY,
                harnesses=[("remote", harness.address)],
                harness_tls_ca=pki.ca.cert,
            ),
            HostConfig(listen="127.0.0.1:0", journal=MEMORY, harnesses=[("remote", harness.address)]),
        ):
            async with serving(config) as (address,), SessionsClient.connect(address) as client:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await echo_turn(client, "remote")
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await harness.stop(None)


async def test_harness_command_serves_mutual_tls(pki: PKI, monkeypatch: pytest.MonkeyPatch) -> None:
    host_client = pki.client("agentsessions-host")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    argv = [
        *serve_argv("agentsessions.harnesses.echo:EchoHarness"),
        "--tls-cert",
        pki.harness.cert,
        "--tls-key",
        pki.harness.key,
        "--tls-client-ca",
        pki.ca.cert,
    ]
    async with harness_process(argv) as proc:
        trusted = ClientTLS(pki.ca.cert, host_client.cert, host_client.key).credentials()
        async with RemoteHarness(proc.address, credentials=trusted) as link:
            assert (await link.describe()).id == "echo"
        async with RemoteHarness(proc.address, credentials=ClientTLS(pki.ca.cert).credentials()) as link:
            with pytest.raises(HarnessUnavailableError):
                await link.describe()
        async with RemoteHarness(proc.address) as link:
            with pytest.raises(HarnessUnavailableError):
                await link.describe()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tls-cert", "c.pem"], "--tls-cert and --tls-key go together"),
        (["--tls-key", "k.pem"], "--tls-cert and --tls-key go together"),
        (["--tls-client-ca", "ca.pem"], "--tls-client-ca needs --tls-cert and --tls-key"),
    ],
)
def test_harness_command_refuses_incomplete_tls_flags(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        harness_cli.main(
            ["serve", "agentsessions.harnesses.echo:EchoHarness", "--listen", "127.0.0.1:0", *flags]
        )
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_harness_command_names_an_unreadable_tls_file(pki: PKI, capsys: pytest.CaptureFixture[str]) -> None:
    missing = os.path.join(os.path.dirname(pki.ca.cert), "missing.pem")
    code = harness_cli.main(
        [
            "serve",
            "agentsessions.harnesses.echo:EchoHarness",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            missing,
            "--tls-key",
            pki.harness.key,
        ]
    )
    assert code == 1
    assert f"TLS certificate {missing!r} cannot be read" in capsys.readouterr().err


def test_config_tls_rules(pki: PKI) -> None:
    cert, key, ca = pki.server.cert, pki.server.key, pki.ca.cert
    with pytest.raises(ConfigError, match="--tls-cert and --tls-key go together"):
        HostConfig(tls_cert=cert)
    with pytest.raises(ConfigError, match=r"--tls-client-ca \(mutual TLS\) needs --tls-cert"):
        HostConfig(tls_client_ca=ca)
    with pytest.raises(ConfigError, match="--harness-tls-cert and --harness-tls-key go together"):
        HostConfig(harness_tls_ca=ca, harness_tls_cert=cert)
    with pytest.raises(
        ConfigError, match=r"--harness-tls-cert \(mutual TLS to harnesses\) needs --harness-tls-ca"
    ):
        HostConfig(harness_tls_cert=cert, harness_tls_key=key)
    with pytest.raises(ConfigError, match=r"--tls-key '/nonexistent/key\.pem': no such file"):
        HostConfig(tls_cert=cert, tls_key="/nonexistent/key.pem")
    config = HostConfig(tls_cert=cert, tls_key=key, tls_client_ca=ca)
    assert config.server_tls == ServerTLS(cert, key, ca)
    assert config.server_tls is not None and config.server_tls.mutual
    assert HostConfig().server_tls is None and HostConfig().harness_tls is None


def test_config_tls_flags_come_from_the_environment(pki: PKI) -> None:
    environ = {
        "AGENTSESSIONS_TLS_CERT": pki.server.cert,
        "AGENTSESSIONS_TLS_KEY": pki.server.key,
        "AGENTSESSIONS_TLS_CLIENT_CA": pki.ca.cert,
        "AGENTSESSIONS_HARNESS_TLS_CA": pki.ca.cert,
    }
    config = HostConfig.from_sources(argparse.Namespace(), environ)
    assert config.server_tls == ServerTLS(pki.server.cert, pki.server.key, pki.ca.cert)
    assert config.harness_tls == ClientTLS(pki.ca.cert)
    # A flag wins over its variable.
    flagged = HostConfig.from_sources(argparse.Namespace(tls_client_ca=pki.rogue.cert), environ)
    assert flagged.tls_client_ca == pki.rogue.cert


async def test_a_file_that_is_not_pem_stops_startup_naming_it(pki: PKI, tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.pem"
    bogus.write_text("not a certificate\n")
    config = HostConfig(listen="127.0.0.1:0", journal=MEMORY, tls_cert=str(bogus), tls_key=pki.server.key)
    with pytest.raises(StartupError, match=f"TLS certificate '{bogus}' holds no PEM certificate"):
        async with serving(config):
            pass
    with pytest.raises(TLSFilesError, match="needs its key"):
        ClientTLS(pki.ca.cert, cert_file=pki.server.cert)
