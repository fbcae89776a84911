"""Network addresses the host listens on and dials: the one home of their rules.

A harness address (``--harness``, a HarnessRegistry entry, what :class:`RemoteHarness` dials) is
``host:port``, ``dns:///host:port``, ``dns://resolver/host:port``, ``unix:path`` or
``unix:///abs/path``; a listen address is ``host:port`` (port 0 picks a free one), ``unix:path``
or ``unix:///abs/path``. Hosts are IP literals (IPv6 in brackets) or DNS names; ports 1..65535.
A breach raises :class:`AddressError` saying which rule; callers prefix the flag or field.
"""

from __future__ import annotations

import ipaddress
import re

HARNESS_FORMS = "host:port, dns:///host:port, dns://resolver/host:port, unix:path or unix:///abs/path"
LISTEN_FORMS = "host:port (port 0 picks a free one), unix:path or unix:///abs/path"

_HOSTNAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*")


class AddressError(ValueError):
    """An address breaks a rule; the message names the address and the rule."""


def check_harness_address(address: str) -> None:
    """Refuse anything but the forms the host dials a harness at (see the module docstring)."""
    try:
        if address.startswith("unix:"):
            _check_unix(address)
        elif address.startswith("dns:"):
            rest = address.removeprefix("dns:")
            if not rest.startswith("//"):
                raise AddressError("dns: needs dns:///host:port or dns://resolver/host:port")
            authority, slash, target = rest.removeprefix("//").partition("/")
            if not slash:
                raise AddressError("dns:// needs a /host:port after the resolver")
            if authority:
                _check_host_port(authority, port_required=False)
            _check_host_port(target, port_required=True)
        else:
            _check_host_port(address, port_required=True)
    except AddressError as exc:
        raise AddressError(f"harness address {address!r}: {exc}; expected {HARNESS_FORMS}") from None


def check_listen_address(address: str) -> None:
    """Refuse anything but the forms the host listens on."""
    try:
        if address.startswith("unix:"):
            _check_unix(address)
        else:
            _check_host_port(address, port_required=True, allow_port_zero=True)
    except AddressError as exc:
        raise AddressError(f"listen address {address!r}: {exc}; expected {LISTEN_FORMS}") from None


def split_host_port(address: str) -> tuple[str, str]:
    """Split ``host:port`` or ``[ipv6]:port``; an IPv6 host must be bracketed."""
    if address.startswith("["):
        host, bracket, rest = address[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise AddressError(f"{address!r} is not [ipv6]:port")
        return host, rest[1:]
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise AddressError(f"{address!r} needs host:port")
    if ":" in host:
        raise AddressError(f"{address!r}: an IPv6 host goes in brackets, [::1]:port")
    return host, port


def check_port(port: str, *, allow_zero: bool = False) -> None:
    lowest = 0 if allow_zero else 1
    # isascii: str.isdigit() also holds for digits int() refuses (superscripts, say).
    if not (port.isascii() and port.isdigit()) or not lowest <= int(port) <= 65535:
        raise AddressError(f"port {port!r} must be {lowest}..65535")


def is_loopback(address: str) -> bool:
    """Whether a listen address is reachable from this machine only (unix, localhost, loopback IP)."""
    if address.startswith("unix:"):
        return True
    try:
        host, _ = split_host_port(address)
    except AddressError:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_unix(address: str) -> None:
    path = address.removeprefix("unix:")
    if path.startswith("//"):
        path = path.removeprefix("//")
        if not path.startswith("/") or len(path) < 2:
            raise AddressError("unix:// needs an absolute path (unix:///abs/path)")
    elif not path:
        raise AddressError("unix: needs a socket path")


def _check_host_port(host_port: str, *, port_required: bool, allow_port_zero: bool = False) -> None:
    if port_required or host_port.startswith("[") or host_port.count(":") == 1:
        host, port = split_host_port(host_port)
        check_port(port, allow_zero=allow_port_zero)
    else:
        host = host_port
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if len(host) > 253 or not _HOSTNAME.fullmatch(host):
        raise AddressError(f"{host!r} is not a host name or IP")
