"""The journal: durable session rows and per-session hash-chained event logs.

``open_store`` opens the store a journal location names (``parse_location`` says what each form
means); every store implements ``agentsessions.host.journal.store.JournalStore``. The rules every
store applies live in ``agentsessions.host.journal.rules``; the ones about listing (the
ListSessions cursor and page size bounds) live here so they are spelled once.
"""

from __future__ import annotations

import base64
import binascii
import re
import urllib.parse
from typing import Any, Final, Literal

from agentsessions.host.journal.store import (
    COMPUTE_COLD,
    COMPUTE_LIVE,
    COMPUTE_NONE,
    ConflictError,
    FencedError,
    Head,
    InvalidPageTokenError,
    JournalLocationError,
    JournalStore,
    JournalUnavailableError,
    SchemaError,
    SessionExistsError,
    SessionNotFoundError,
    SessionRow,
    StoreError,
    TamperedError,
)
from agentsessions.sdk.structs import struct

__all__ = [
    "COMPUTE_COLD",
    "COMPUTE_LIVE",
    "COMPUTE_NONE",
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "MAX_SEQ",
    "ConflictError",
    "FencedError",
    "Head",
    "InvalidPageTokenError",
    "JournalKind",
    "JournalLocation",
    "JournalLocationError",
    "JournalStore",
    "JournalUnavailableError",
    "PostgresURLError",
    "SchemaError",
    "SessionExistsError",
    "SessionNotFoundError",
    "SessionRow",
    "StoreError",
    "TamperedError",
    "clamp_page_size",
    "decode_page_token",
    "encode_page_token",
    "open_store",
    "parse_location",
    "redact_url",
    "validate_postgres_url",
]

DEFAULT_PAGE_SIZE: Final = 50
MAX_PAGE_SIZE: Final = 500
# The largest seq (and timestamp) a journal stores: a signed 64-bit integer, as SQL keeps it.
MAX_SEQ: Final = 2**63 - 1

JournalKind = Literal["memory", "sqlite", "postgres"]

MEMORY_LOCATION: Final = "memory:"
SQLITE_SCHEME: Final = "sqlite://"
POSTGRES_SCHEMES: Final = ("postgres://", "postgresql://")
_URL_SCHEME: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
_FORMS: Final = "a SQLite file path, sqlite://PATH, 'memory:' or a postgres:// (postgresql://) URL"


# -- journal locations ----------------------------------------------------------------------------


class PostgresURLError(JournalLocationError):
    """A journal URL that is not a usable PostgreSQL connection URL."""


@struct(frozen=True)
class JournalLocation:
    """What a journal location names: ``target`` is the SQLite file path, the PostgreSQL URL, or
    "" for memory."""

    kind: JournalKind
    target: str


def parse_location(location: str) -> JournalLocation:
    """The one reading of a journal location (``--journal``, ``open_store``):

    * ``memory:`` - a fresh in-process store (nothing survives the process);
    * ``postgres://...`` / ``postgresql://...`` - PostgreSQL (the URL's shape is checked here);
    * ``sqlite://PATH`` - the SQLite file PATH, taken verbatim (``sqlite:///var/j.db`` is
      ``/var/j.db``, ``sqlite://j.db`` is ``j.db`` in the working directory);
    * anything else without a URL scheme - a SQLite file path.

    Raises JournalLocationError (PostgresURLError for a malformed PostgreSQL URL) naming the rule."""
    if location == MEMORY_LOCATION:
        return JournalLocation("memory", "")
    if location.startswith(POSTGRES_SCHEMES):
        return JournalLocation("postgres", validate_postgres_url(location))
    if location.startswith(SQLITE_SCHEME):
        path = location[len(SQLITE_SCHEME) :]
        if not path:
            raise JournalLocationError(f"journal location {location!r} names no SQLite file (sqlite://PATH)")
        return JournalLocation("sqlite", path)
    if not location:
        raise JournalLocationError(f"journal location is empty: expected {_FORMS}")
    if _URL_SCHEME.match(location):
        scheme = location.partition(":")[0]
        raise JournalLocationError(f"journal location {location!r} has scheme {scheme!r}: expected {_FORMS}")
    return JournalLocation("sqlite", location)


def redact_url(url: str) -> str:
    """The URL with any password replaced, safe for messages and logs."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = f"{user}:***@{host}" + (f":{port}" if port is not None else "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def validate_postgres_url(url: str) -> str:
    """Check the shape of a ``postgres://`` / ``postgresql://`` URL; returns it unchanged.

    Raises PostgresURLError naming what is wrong; the message never echoes a password."""
    shown = redact_url(url)
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:
        raise PostgresURLError(f"malformed PostgreSQL URL {shown}: {exc}") from None
    if parts.scheme not in ("postgres", "postgresql"):
        raise PostgresURLError(
            f"malformed PostgreSQL URL {shown}: scheme must be postgres:// or postgresql://"
        )
    try:
        port = parts.port
    except ValueError:
        raise PostgresURLError(
            f"malformed PostgreSQL URL {shown}: port is not a number in 1..65535"
        ) from None
    if port == 0:
        raise PostgresURLError(f"malformed PostgreSQL URL {shown}: port is not a number in 1..65535")
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    if not parts.hostname and "host" not in query:
        raise PostgresURLError(f"malformed PostgreSQL URL {shown}: no host (use postgresql://HOST[:PORT]/DB)")
    database = parts.path.lstrip("/")
    if "/" in database:
        raise PostgresURLError(f"malformed PostgreSQL URL {shown}: database name may not contain '/'")
    if parts.fragment:
        raise PostgresURLError(f"malformed PostgreSQL URL {shown}: unexpected '#' fragment")
    return url


async def open_store(location: str, **opts: Any) -> JournalStore:
    """Open the journal store ``location`` names (see ``parse_location``).

    ``opts`` go to ``SqliteStore.open`` or ``PostgresStore.open``; the memory store takes only
    ``kept_listed``, as they all do."""
    where = parse_location(location)
    if where.kind == "memory":
        from agentsessions.host.journal.memory import MemoryStore

        if set(opts) - {"kept_listed"}:
            raise TypeError(f"the memory store takes no options but kept_listed, got {sorted(opts)}")
        return MemoryStore(**opts)
    if where.kind == "postgres":
        from agentsessions.host.journal.postgres import PostgresStore

        return await PostgresStore.open(where.target, **opts)
    from agentsessions.host.journal.sqlite import SqliteStore

    return await SqliteStore.open(where.target, **opts)


# -- listing ----------------------------------------------------------------------------------------


def clamp_page_size(page_size: int) -> int:
    """ListSessions page size: <=0 means the default, larger than the maximum is clamped."""
    if page_size <= 0:
        return DEFAULT_PAGE_SIZE
    return min(page_size, MAX_PAGE_SIZE)


def encode_page_token(create_time_ns: int, uid: str) -> str:
    """The reference's ListSessions cursor: unpadded base64url of ``"<created_at_ns>\\x00<uid>"``."""
    raw = f"{create_time_ns}\x00{uid}".encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_page_token(token: str) -> tuple[int, str]:
    """(create_time_ns, uid) of a cursor ``encode_page_token`` made; InvalidPageTokenError otherwise."""
    bad = InvalidPageTokenError(f"page_token {token!r} is not a cursor this server issued")
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
        text = raw.decode("utf-8")
    except (binascii.Error, ValueError):
        raise bad from None
    nanos, sep, uid = text.partition("\x00")
    if not sep or not uid or not nanos.isdigit() or not nanos.isascii() or int(nanos) > MAX_SEQ:
        raise bad
    if any(ord(c) < 0x20 for c in uid):  # no uid holds one (and PostgreSQL's text holds no NUL)
        raise bad
    # Only the canonical spelling round-trips; anything else was not issued by us.
    if encode_page_token(int(nanos), uid) != token:
        raise bad
    return int(nanos), uid
