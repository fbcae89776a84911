"""Listed session rows kept decoded while they do not change, for the next listing.

A listing's page is mostly rows that did not change since the page before it: a console polling,
listers paging through a fleet whose sessions turn now and then. A store keys each listed row by
what it read for it (the SQLite store: the row's JSON line; PostgreSQL: the record's values; the
memory store: the session's creation and derived state), which changes whenever the row does (an
append moves the session's head and hash), so a row read again with the same key is the same row:
it is decoded once, and the :class:`SessionRow` it gives is the same object every time. The
service keeps each listed row's wire encoding beside that object (``service.convert.SessionWire``),
so an unchanged session costs a page a lookup, not a decode and an encode. Bounded
(``--max-kept-listed-sessions``): the oldest half goes when it fills; 0 keeps none.
Used on the event loop's thread only.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

from agentsessions.host.journal.store import KEPT_LISTED, SessionRow

_K = TypeVar("_K")


def make_room(kept: dict[Any, Any], coming: int, capacity: int) -> None:
    """Drop the oldest half of ``kept`` (and as many more as are ``coming``) when the ``coming``
    entries would take it past ``capacity``."""
    if len(kept) + coming > capacity:
        for old in list(itertools.islice(kept, len(kept) // 2 + coming)):
            del kept[old]


class ListedRows(Generic[_K]):
    """Listed rows, one a session (see the module docstring).

    Each row is named by its session and its key: the row kept for a session is the one its key
    names, and a changed row (a new key) takes its session's place, so what is kept grows with the
    sessions listed, never with how often they change."""

    def __init__(self, capacity: int = KEPT_LISTED) -> None:
        self.capacity = capacity  # sessions; 0: keep none
        self._rows: dict[Hashable, tuple[_K, SessionRow]] = {}
        self.decoded = 0  # rows decoded, not found here (stats, tests)

    def rows(
        self, named: Sequence[tuple[Hashable, _K]], decode: Callable[[list[_K]], list[SessionRow]]
    ) -> list[SessionRow]:
        """The rows ``named`` (session, key) pairs name, in their order: kept ones as kept, the
        others by ``decode`` (given the keys of the rows not kept, in one call; it returns their rows
        in that order)."""
        kept = self._rows
        found: list[SessionRow | None] = []
        missing: list[int] = []
        for session, key in named:
            entry = kept.get(session)
            if entry is not None and entry[0] == key:
                found.append(entry[1])
            else:
                missing.append(len(found))
                found.append(None)
        if missing:
            decoded = decode([named[i][1] for i in missing])
            self.decoded += len(missing)
            capacity = self.capacity
            make_room(kept, sum(1 for i in missing if named[i][0] not in kept), capacity)
            for i, row in zip(missing, decoded, strict=True):
                found[i] = row
                session, key = named[i]
                if session in kept or len(kept) < capacity:
                    kept[session] = (key, row)
        return [row for row in found if row is not None]

    def __len__(self) -> int:
        return len(self._rows)

    def clear(self) -> None:
        self._rows.clear()
