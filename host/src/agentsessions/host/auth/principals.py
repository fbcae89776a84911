"""Who may call the host: the ``--auth-tokens`` file of principals, their projects and roles.

The file (JSON, or TOML when its name ends in ``.toml``) maps credentials to principals::

    [tokens."<bearer token, at least 16 characters>"]         # or "sha256:<64 hex digits>"
    principal = "user:alice"
    issuer = "agentsessions"           # optional, journaled with the principal
    subject = "alice@example.com"      # optional, journaled with the principal
    projects = ["default", "payments"] # or "*" for every project
    roles = ["reader", "writer", "approver"]

    [certificates."spiffe://example.org/ns/ops/sa/console"]   # a SAN of a client certificate
    principal = "svc:console"
    projects = "*"
    roles = ["admin"]

    [certificates."CN=batch-runner"]                         # or its subject common name
    principal = "svc:batch"
    projects = ["batch"]
    roles = ["writer"]

A token may be written as ``sha256:`` and the hex SHA-256 of the token, so the file need not hold
the secret itself. Roles: ``reader`` (GetSession, ListSessions, Replay), ``writer`` (CreateSession,
Exec, Suspend, Resume, Fork, Cancel, DeleteSession), ``approver`` (Approve), ``admin``
(HarnessRegistry). ``admin`` implies every role; ``writer`` and ``approver`` imply ``reader``.
Principals named ``host:...`` are reserved for the host's own journaled decisions.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

READER = "reader"
WRITER = "writer"
APPROVER = "approver"
ADMIN = "admin"
ROLES = (READER, WRITER, APPROVER, ADMIN)

# What each granted role also grants.
_IMPLIED = {
    READER: frozenset({READER}),
    WRITER: frozenset({WRITER, READER}),
    APPROVER: frozenset({APPROVER, READER}),
    ADMIN: frozenset(ROLES),
}

ALL_PROJECTS = "*"
MIN_TOKEN_LENGTH = 16
_DIGEST_PREFIX = "sha256:"
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")
_ENTRY_KEYS = frozenset({"principal", "issuer", "subject", "projects", "roles"})
_RESERVED_PREFIX = "host:"


class AuthFileError(ValueError):
    """The token file cannot be read or breaks a rule; the message names the file and the entry."""


@struct(frozen=True)
class Principal:
    """An authenticated caller: who (journaled as the actor), where (projects) and what (roles)."""

    principal: str
    issuer: str = ""
    subject: str = ""
    # None: every project ("*").
    projects: frozenset[str] | None = frozenset()
    roles: frozenset[str] = frozenset()

    def identity(self) -> common_pb2.IdentityRef:
        return common_pb2.IdentityRef(principal=self.principal, issuer=self.issuer, subject=self.subject)

    def may_use(self, project: str) -> bool:
        return self.projects is None or project in self.projects

    def has_role(self, role: str) -> bool:
        return any(role in _IMPLIED[granted] for granted in self.roles)


class Principals:
    """The loaded file: bearer tokens (compared in constant time) and certificate identities."""

    def __init__(
        self, tokens: Iterable[tuple[bytes, Principal]], certificates: Mapping[str, Principal]
    ) -> None:
        self._tokens = list(tokens)
        self._certificates = dict(certificates)

    def __len__(self) -> int:
        return len(self._tokens) + len(self._certificates)

    def by_token(self, token: str) -> Principal | None:
        """The principal of a bearer token. Every entry is compared, in constant time each, so the
        time taken does not depend on which entry (if any) matched."""
        digest = hashlib.sha256(token.encode()).digest()
        found: Principal | None = None
        for expected, principal in self._tokens:
            if hmac.compare_digest(digest, expected) and found is None:
                found = principal
        return found

    def by_certificate(self, common_names: Iterable[str], sans: Iterable[str]) -> list[Principal]:
        """The distinct principals a client certificate maps to (by SAN or by ``CN=``)."""
        matched: list[Principal] = []
        keys = [*sans, *(f"CN={name}" for name in common_names)]
        for key in keys:
            principal = self._certificates.get(key)
            if principal is not None and principal not in matched:
                matched.append(principal)
        return matched


def load_principals(path: str) -> Principals:
    """Read and check a token file; raises :class:`AuthFileError` naming what is wrong."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AuthFileError(f"{path!r} cannot be read: {exc}") from None
    try:
        document: Any = tomllib.loads(text) if path.endswith(".toml") else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        kind = "TOML" if path.endswith(".toml") else "JSON"
        raise AuthFileError(f"{path!r} is not valid {kind}: {exc}") from None
    return parse_principals(document, path)


def parse_principals(document: Any, source: str = "auth tokens") -> Principals:
    if not isinstance(document, dict):
        raise AuthFileError(f"{source!r}: expected a table with 'tokens' and/or 'certificates'")
    unknown = set(document) - {"tokens", "certificates"}
    if unknown:
        raise AuthFileError(f"{source!r}: unknown key(s) {sorted(unknown)}; expected tokens, certificates")
    tokens: list[tuple[bytes, Principal]] = []
    for number, (key, entry) in enumerate(_table(document, "tokens", source).items(), start=1):
        # Entries are named by position: a message must never carry the token.
        tokens.append((_token_digest(key, source), _principal(entry, f"{source!r} token #{number}")))
    certificates = {
        key: _principal(entry, f"{source!r} certificates[{key!r}]")
        for key, entry in _table(document, "certificates", source).items()
    }
    for key in certificates:
        if not key or key != key.strip() or key == "CN=":
            raise AuthFileError(f"{source!r}: certificate identity {key!r} must be a SAN or CN=<name>")
    if not tokens and not certificates:
        raise AuthFileError(f"{source!r} names no tokens and no certificates: nobody could call the host")
    return Principals(tokens, certificates)


def _table(document: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    table = document.get(name, {})
    if not isinstance(table, dict):
        raise AuthFileError(f"{source!r}: {name} must be a table keyed by credential")
    return table


def _token_digest(token: str, source: str) -> bytes:
    if token.startswith(_DIGEST_PREFIX):
        hex_digest = token[len(_DIGEST_PREFIX) :]
        if not _HEX_DIGEST.fullmatch(hex_digest):
            raise AuthFileError(f"{source!r}: a sha256: token must be followed by 64 lowercase hex digits")
        return bytes.fromhex(hex_digest)
    if len(token) < MIN_TOKEN_LENGTH or any(c.isspace() for c in token):
        raise AuthFileError(
            f"{source!r}: every token must be at least {MIN_TOKEN_LENGTH} characters without whitespace"
        )
    return hashlib.sha256(token.encode()).digest()


def _principal(entry: Any, where: str) -> Principal:
    if not isinstance(entry, dict):
        raise AuthFileError(f"{where}: expected a table with principal, projects and roles")
    unknown = set(entry) - _ENTRY_KEYS
    if unknown:
        raise AuthFileError(f"{where}: unknown key(s) {sorted(unknown)}; expected {sorted(_ENTRY_KEYS)}")
    name = entry.get("principal")
    if not isinstance(name, str) or not name.strip():
        raise AuthFileError(f"{where}: principal must be a non-empty string")
    if name.startswith(_RESERVED_PREFIX):
        raise AuthFileError(
            f"{where}: principal {name!r}: names starting {_RESERVED_PREFIX!r} are the host's own"
        )
    issuer = entry.get("issuer", "")
    subject = entry.get("subject", "")
    if not isinstance(issuer, str) or not isinstance(subject, str):
        raise AuthFileError(f"{where}: issuer and subject must be strings")
    return Principal(
        principal=name,
        issuer=issuer,
        subject=subject,
        projects=_projects(entry.get("projects"), where),
        roles=_roles(entry.get("roles"), where),
    )


def _projects(value: Any, where: str) -> frozenset[str] | None:
    if value == ALL_PROJECTS:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(p, str) and p for p in value):
        raise AuthFileError(f'{where}: projects must be "*" or a non-empty list of project names')
    return frozenset(value)


def _roles(value: Any, where: str) -> frozenset[str]:
    if not isinstance(value, list) or not value or not all(isinstance(r, str) for r in value):
        raise AuthFileError(f"{where}: roles must be a non-empty list of {', '.join(ROLES)}")
    unknown = sorted(set(value) - set(ROLES))
    if unknown:
        raise AuthFileError(f"{where}: unknown role(s) {unknown}; roles are {', '.join(ROLES)}")
    return frozenset(value)
