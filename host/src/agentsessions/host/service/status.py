"""The one table that maps domain errors to gRPC status codes."""

from __future__ import annotations

import logging

import grpc

from agentsessions.host.controller import errors as ce
from agentsessions.host.journal import store as js

log = logging.getLogger("agentsessions.service")

# Checked in order: subclasses before their bases.
_TABLE: list[tuple[type[BaseException], grpc.StatusCode]] = [
    (ce.InvalidArgumentError, grpc.StatusCode.INVALID_ARGUMENT),
    (js.JournalUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (js.SessionNotFoundError, grpc.StatusCode.NOT_FOUND),
    (ce.UnauthenticatedError, grpc.StatusCode.UNAUTHENTICATED),
    (ce.PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (ce.SessionBusyError, grpc.StatusCode.ABORTED),
    (ce.ConcurrencyError, grpc.StatusCode.ABORTED),
    (js.ConflictError, grpc.StatusCode.ABORTED),
    (js.FencedError, grpc.StatusCode.ABORTED),
    (ce.FailedPreconditionError, grpc.StatusCode.FAILED_PRECONDITION),
    (ce.HarnessUnavailableError, grpc.StatusCode.UNAVAILABLE),
    (ce.DeadlineExceededError, grpc.StatusCode.DEADLINE_EXCEEDED),
    (ce.ResourceExhaustedError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    # A record a harness, model or tool produced mid-turn: a harness failure (spec 1.1 Exec 8).
    (ce.UnrecordableError, grpc.StatusCode.INTERNAL),
    (ce.ExecutionCancelled, grpc.StatusCode.CANCELLED),
    (ce.ReplayDivergedError, grpc.StatusCode.INTERNAL),
    (ce.HarnessRunError, grpc.StatusCode.INTERNAL),
    (js.SessionExistsError, grpc.StatusCode.ALREADY_EXISTS),
    (ce.IdempotencyKeyConflictError, grpc.StatusCode.ALREADY_EXISTS),
    (js.InvalidPageTokenError, grpc.StatusCode.INVALID_ARGUMENT),
]


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and message for an error raised below the service layer."""
    for cls, code in _TABLE:
        if isinstance(exc, cls):
            return code, str(exc)
    log.error("unexpected error: %s", type(exc).__name__, exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}"
