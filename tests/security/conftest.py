"""Fixtures of the security tests: a throwaway PKI and a free port (the host runs in process
through ``tests.support.serving``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.certs import Authority, Issued


@dataclass(frozen=True)
class PKI:
    ca: Authority
    rogue: Authority  # a second CA nobody here trusts
    server: Issued
    harness: Issued

    def client(self, common_name: str, *, uri: str | None = None) -> Issued:
        return self.ca.client(common_name, uri=uri)


@pytest.fixture
def pki(tmp_path: Path) -> PKI:
    ca = Authority(tmp_path, "ca")
    return PKI(ca, Authority(tmp_path, "rogue"), ca.server("host"), ca.server("harness"))
