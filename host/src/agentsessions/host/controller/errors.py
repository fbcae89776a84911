"""Domain errors of the controller. The service layer maps each class to one gRPC status
(``agentsessions.host.service.status``); the controller itself knows nothing about gRPC.

An unknown session is the journal's ``SessionNotFoundError`` (``agentsessions.host.journal.store``),
raised by the controller and the stores alike; an unreachable harness is
:class:`HarnessUnavailableError`, raised by the Describe bound and by the harness link alike."""

from __future__ import annotations

from agentsessions.sdk.errors import ToolCallRejectedError


class ControllerError(Exception):
    """Base class of controller errors."""


class InvalidArgumentError(ControllerError):
    """A request field breaks a rule; the message names the field and the rule."""

    def __init__(self, field: str, rule: str) -> None:
        super().__init__(f"{field}: {rule}")
        self.field = field
        self.rule = rule


class SessionBusyError(ControllerError):
    """Another Exec/Suspend/Resume/Approve/Fork holds the session on this host (or, as ``why``
    says, the session's turn runs on another host, or turns are queued before this one)."""

    def __init__(self, uid: str, why: str = "with another operation on this host") -> None:
        super().__init__(f"session {uid!r} is busy {why}")


class IdempotencyKeyConflictError(ControllerError):
    """The request's idempotency-key was already used for a different request."""


class ConcurrencyError(ControllerError):
    """The journal's CAS or fence refused the append (another writer won)."""


class FailedPreconditionError(ControllerError):
    """The session is not in a state that allows the operation."""


class InvalidExecutionLogError(FailedPreconditionError):
    """The journal cannot establish a complete, well-formed invocation."""


class IncompleteInvocationError(InvalidExecutionLogError):
    """The interrupted turn's inputs were only partly committed; Exec again with all inputs."""


class InvalidApprovalCallError(FailedPreconditionError, ToolCallRejectedError):
    """A REQUIRES_APPROVAL call is refused before intent (no key, bad arguments, ...)."""


class InheritedToolIntentError(InvalidExecutionLogError):
    """A fork-copied tool intent cannot be re-driven under the child's uid."""


class HarnessMismatchError(FailedPreconditionError):
    """The served harness is not the one (name/version) the journal recorded."""


class HarnessMisdescribedError(FailedPreconditionError):
    """The harness's Describe answer breaks the contract (does not decode, has no id, names a
    resumability this host does not know): nothing can be placed on it."""


class UnplaceableError(FailedPreconditionError):
    """The harness's needs cannot be met by the runtime (e.g. memory snapshots)."""


class PermissionDeniedError(ControllerError):
    """The authenticated caller may not do this (a project it may not use, an identity not its own)."""


class UnauthenticatedError(ControllerError):
    """Authentication is on and the call carries no authenticated principal."""


class HarnessUnavailableError(ControllerError):
    """The harness could not be reached, or stopped answering. ``code`` is the transport's status
    when a link reported one (opaque here: the harness link sets and reads it)."""

    def __init__(self, message: str, code: object = None) -> None:
        super().__init__(message)
        self.code = code


class ResourceExhaustedError(ControllerError):
    """A host limit is reached (running executions, a record's size); the message names the flag."""


class RecordTooLargeError(ResourceExhaustedError):
    """A record is larger than ``--max-record-bytes``: it is refused before it is journaled."""


class UnrecordableError(ControllerError):
    """A record holds a value the journal cannot hash or a reader could not decode (a NaN, JSON
    nested too deep, a negative token count); raised before anything is written."""


class DeadlineExceededError(ControllerError):
    """The caller's deadline passed."""


class ReplayDivergedError(ControllerError):
    """Replay or recovery diverged from the journal; sticky for the execution."""


class HarnessRunError(ControllerError):
    """The harness's run failed mid-turn; the turn is left interrupted for Resume."""


class ExecutionCancelled(ControllerError):
    """The turn was stopped by Cancel; END{CANCELED} and a CANCEL marker were journaled."""
