"""What every part of the controller shares: one :class:`Core` per host.

The Controller builds it once; each concern module (sessions, turns, recovery, replay, fork,
approvals, cancel) is a set of functions over it, as the reference's controller files are methods
of one type. Per-session state lives in the journal, the journal cache, the guards and the table of
running turns; nothing else is mutable here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from agentsessions.host.controller.access import SessionAccess
from agentsessions.host.controller.admission import Admission
from agentsessions.host.controller.approval_policy import ApprovalPolicy
from agentsessions.host.controller.drive import Driver
from agentsessions.host.controller.guard import SessionGuards
from agentsessions.host.controller.harnesses import HarnessCatalog
from agentsessions.host.controller.journal_cache import JournalCache
from agentsessions.host.controller.pacing import LoopBudget, ReadPacer
from agentsessions.host.controller.results import DEFAULT_CORRECTIONS
from agentsessions.host.controller.sinks import SinkFactory
from agentsessions.host.controller.writer import JournalWriter
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.limits import ExecutionSlots, Limits
from agentsessions.sdk.structs import struct

if TYPE_CHECKING:  # compaction imports the controller's sessions module, which imports the Core
    from agentsessions.host.controller.compaction import Compactor


@struct(frozen=True)
class Core:
    store: JournalStore  # the authority; read through the cache, written through the writer
    cache: JournalCache
    writer: JournalWriter
    catalog: HarnessCatalog  # which harness (and runtime) serves a session
    sinks: SinkFactory
    driver: Driver  # runs harnesses; its table of running turns is what Cancel stops
    guards: SessionGuards
    policy: ApprovalPolicy  # the host's own decisions at approval gates
    access: SessionAccess  # who may act on which project, and who is journaled as the actor
    new_id: Callable[[], str]  # execution ids
    default_project: str
    purge_on_delete: bool
    cancel_grace_s: float
    limits: Limits  # request, record and concurrency limits (agentsessions.host.limits)
    slots: ExecutionSlots  # executions running on this host, bounded by the limits
    reads: LoopBudget  # the calls streaming records (Replay, Watch) yield to turns under load (pacing.py)
    listing: ReadPacer  # and so do the sessions ListSessions pages hold
    # How Exec admits a turn: the reference's way, or with leases, keys and queues (admission.py).
    admission: Admission
    # Corrective turns a turn bound to a result schema may take (controller/results.py).
    result_corrections: int = DEFAULT_CORRECTIONS
    # The summarizer and the automatic compaction policy (controller/compaction.py).
    compactor: Compactor | None = None
