"""Pooled random ids (host/ids.py): the shape secrets.token_hex gives, never repeated, not even
across a fork."""

from __future__ import annotations

import os
import re

from agentsessions.host import ids


def test_ids_are_lowercase_hex_of_the_asked_length_and_distinct() -> None:
    minted = [ids.token_hex(8) for _ in range(5000)]  # more than one pool's worth
    assert all(re.fullmatch(r"[0-9a-f]{16}", i) for i in minted)
    assert len(set(minted)) == len(minted)
    assert re.fullmatch(r"[0-9a-f]{8192}", ids.token_hex(4096))  # larger than a pool


def test_a_forked_child_never_hands_out_its_parents_next_ids() -> None:
    ids.token_hex(8)  # the pool holds bytes both processes would otherwise share
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            os.write(write, ",".join(ids.token_hex(8) for _ in range(3)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split(",")
    os.waitpid(pid, 0)
    parent = [ids.token_hex(8) for _ in range(3)]
    assert len(child) == 3 and not set(child) & set(parent)
