"""One harness-address rule for every place that takes one: ``--harness`` (config), the address a
RemoteHarness dials (harness link) and a HarnessRegistry entry (registry). The last four rows are
where the config's and the link's validators used to disagree (the link dialled them)."""

from __future__ import annotations

import grpc
import pytest

from agentsessions.host.addresses import (
    AddressError,
    check_harness_address,
    check_listen_address,
    is_loopback,
)
from agentsessions.host.config import ConfigError, HostConfig
from agentsessions.host.harnesslink import harness_target
from agentsessions.host.journal.memory import MemoryStore
from agentsessions.v1 import harness_registry_pb2 as hr
from tests.support.host import running_host

TABLE = [
    ("localhost:50051", True),
    ("127.0.0.1:1", True),
    ("[::1]:50051", True),
    ("dns:///harness.example:443", True),
    ("dns://8.8.8.8:53/h:1", True),
    ("unix:rel.sock", True),
    ("unix:///run/h.sock", True),
    ("::1:50051", False),
    ("host", False),
    ("host:0", False),
    ("host:65536", False),
    ("dns:h:1", False),
    ("unix:", False),
    ("unix://rel", False),
    ("h_x:1", False),
    ("a..b:1", False),
    ("-a:1", False),
    ("dns://bad resolver/h:1", False),
]


def verdicts(address: str) -> dict[str, bool]:
    """Whether each place accepts ``address``."""
    found: dict[str, bool] = {}
    try:
        HostConfig(harnesses=[("mine", address)])
        found["config"] = True
    except ConfigError as exc:
        assert str(exc).startswith("--harness mine: harness address")
        found["config"] = False
    try:
        assert harness_target(address) == address
        found["link"] = True
    except ValueError as exc:
        assert "harness address" in str(exc)
        found["link"] = False
    try:
        check_harness_address(address)
        found["rule"] = True
    except AddressError:
        found["rule"] = False
    return found


@pytest.mark.parametrize(("address", "accepted"), TABLE)
def test_every_place_applies_the_same_harness_address_rule(address: str, accepted: bool) -> None:
    assert verdicts(address) == {"config": accepted, "link": accepted, "rule": accepted}


async def test_the_registry_refuses_what_the_rule_refuses() -> None:
    async with running_host(MemoryStore()) as host:
        for i, (address, accepted) in enumerate(TABLE):
            spec = hr.HarnessSpec(remote=hr.RemotePlacement(address=address))
            request = hr.RegisterHarnessRequest(name=f"h{i}", spec=spec)
            if accepted:
                await host.registry.RegisterHarness(request)
                continue
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await host.registry.RegisterHarness(request)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (refused.value.details() or "").startswith("spec.remote.address: harness address")


@pytest.mark.parametrize(
    ("address", "accepted"),
    [
        ("127.0.0.1:0", True),
        ("[::]:50051", True),
        ("unix:/tmp/h.sock", True),
        ("50051", False),
        ("h:x", False),
    ],
)
def test_listen_addresses(address: str, accepted: bool) -> None:
    try:
        check_listen_address(address)
        assert accepted
    except AddressError as exc:
        assert not accepted and str(exc).startswith(f"listen address {address!r}")


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("unix:/tmp/h.sock", True),
        ("localhost:1", True),
        ("127.0.0.1:0", True),
        ("[::1]:1", True),
        ("0.0.0.0:1", False),
    ],
)
def test_loopback_listen_addresses(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback
