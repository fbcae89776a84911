"""What keeps other web sites out of the HTTP API: the rules a browser's request must pass.

The API authenticates with a bearer token in the ``Authorization`` header and never with a cookie,
so a page on another site cannot make the user's browser send the user's credentials (no CSRF
through ambient credentials). Two attacks remain where the host trusts every caller (no
``--auth-tokens``) and listens on loopback, and these rules close them:

* **cross-site requests** (a page on evil.example posting to http://127.0.0.1:8080): the API
  refuses a request whose ``Sec-Fetch-Site`` is ``cross-site`` or ``same-site``, or whose
  ``Origin`` is not this listener's own origin; bodies must be ``application/json`` (protojson),
  which a browser sends across origins only after a CORS preflight this host never grants;
* **DNS rebinding** (evil.example re-resolved to 127.0.0.1, so the page is "same-origin" with the
  listener): on a loopback listener a request whose ``Host`` is not a loopback name or address is
  refused, whatever it asks for.

Clients that are not browsers (curl, scripts) send neither header and pass. Every answer carries
headers that forbid framing, sniffing, cross-origin embedding and any script or style but the
console's own files.
"""

from __future__ import annotations

import ipaddress

import grpc
from aiohttp import web

from agentsessions.host.http.status import HttpError

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}

_DENIED = grpc.StatusCode.PERMISSION_DENIED
_ALLOWED_FETCH_SITES = frozenset({"same-origin", "none"})


def host_name(host_header: str) -> str:
    """The name of a ``Host`` header without its port (``[::1]:8080`` -> ``::1``)."""
    if host_header.startswith("["):
        return host_header[1:].partition("]")[0]
    name, colon, port = host_header.rpartition(":")
    return name if colon and port.isdigit() else host_header


def is_loopback_name(name: str) -> bool:
    lowered = name.lower().rstrip(".")
    if lowered == "localhost" or lowered.endswith(".localhost"):
        return True  # browsers resolve these to loopback themselves, never through DNS
    try:
        return ipaddress.ip_address(lowered).is_loopback
    except ValueError:
        return False


def check_host(request: web.Request) -> None:
    """On a loopback listener, only loopback Host names: a rebinding page sends its own name."""
    name = host_name(request.host)
    if not is_loopback_name(name):
        raise HttpError(
            _DENIED, f"Host: {name[:80]!r} is not a loopback name, and this listener is on loopback"
        )


def check_same_origin(request: web.Request) -> None:
    """An API request from a browser must come from the console's own origin."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in _ALLOWED_FETCH_SITES:
        raise HttpError(_DENIED, f"Sec-Fetch-Site: {site[:40]!r}: the API answers its own origin only")
    origin = request.headers.get("Origin")
    if origin is not None and origin != f"{request.scheme}://{request.host}":
        raise HttpError(_DENIED, f"Origin: {origin[:80]!r} is not this listener's origin")
