"""The HTTP API (JSON and Server-Sent Events) and the web console, on ``--http-listen``.

Every route is a call to the host's own gRPC services over a private loopback channel with the
caller's token forwarded, so authentication, authorization, validation and status codes are the
gRPC ones (docs/http.md). ``server.serve`` starts and drains :class:`HttpListener` beside the gRPC
listeners.
"""

from agentsessions.host.http.listener import HttpListener

__all__ = ["HttpListener"]
