"""How patiently the model provider calls its endpoint: the timeouts and the retry policy.

Plain values, so configuration can build them without importing the HTTP stack
(``models.transport`` applies them with httpx and tenacity, imported only when a provider is built).
"""

from __future__ import annotations

from agentsessions.sdk.structs import struct


@struct(frozen=True)
class Timeouts:
    """``connect`` bounds opening a connection, ``read`` each read (and write), ``total`` the whole
    completion: every request, every wait between them, and the streamed answer."""

    connect: float = 10.0
    read: float = 120.0
    total: float = 300.0

    def __post_init__(self) -> None:
        for name in ("connect", "read", "total"):
            if not getattr(self, name) > 0:
                raise ValueError(f"the {name} timeout must be a positive number of seconds")


@struct(frozen=True)
class RetryPolicy:
    """How often and how patiently a request is retried; ``max_attempts=1`` never retries."""

    max_attempts: int = 4
    initial_backoff: float = 0.5
    max_backoff: float = 20.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.initial_backoff < 0 or self.max_backoff < 0 or self.jitter < 0:
            raise ValueError("backoff and jitter must not be negative")
