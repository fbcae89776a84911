"""Random hex ids without a system call for each one.

``secrets.token_hex`` asks the kernel for every id (``getrandom``), and the call gives up the GIL:
on a loaded host, whose event loop shares the GIL with the journal's connection threads, each
such call can leave the loop waiting for one of those threads to hand it back (py-spy put 2-3%
of a loaded host's event-loop samples on minting the request, execution and model-call ids of
its turns). Here the same kernel source is read 4 KiB at a time and handed out in slices: one
system call per 256 sixteen-byte ids. A forked child starts a pool of its own, so parent and child
never hand out the same bytes.
"""

from __future__ import annotations

import os
import threading
from typing import Final

_POOL_BYTES: Final = 4096


class _Pool:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes = b""
        self._at = 0

    def take(self, nbytes: int) -> bytes:
        with self._lock:
            if self._at + nbytes > len(self._bytes):
                self._bytes = os.urandom(max(_POOL_BYTES, nbytes))
                self._at = 0
            out = self._bytes[self._at : self._at + nbytes]
            self._at += nbytes
            return out

    def forget(self) -> None:
        self._lock = threading.Lock()
        self._bytes = b""
        self._at = 0


_pool = _Pool()
os.register_at_fork(after_in_child=_pool.forget)


def token_hex(nbytes: int) -> str:
    """``nbytes`` random bytes from the kernel's CSPRNG as ``2 * nbytes`` lowercase hex digits,
    as ``secrets.token_hex`` gives them."""
    return _pool.take(nbytes).hex()
