"""``Subagents.GetSubagents`` under ``--auth-tokens``: the ``reader`` role on the session's project;
another project's session answers as an unknown one; no token is UNAUTHENTICATED."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from grpc import aio

from agentsessions.client import SessionsClient
from agentsessions.ext.v1 import subagents_pb2, subagents_pb2_grpc
from agentsessions.host.config import HostConfig
from tests.support.serving import serving

WRITER = "writer-token-0123456789"
READER = "reader-token-0123456789"
OTHER = "other-token-01234567890"
PRINCIPALS = {
    "tokens": {
        WRITER: {"principal": "user:w", "projects": ["default"], "roles": ["writer"]},
        READER: {"principal": "user:r", "projects": ["default"], "roles": ["reader"]},
        OTHER: {"principal": "user:o", "projects": ["other"], "roles": ["reader"]},
    }
}


async def links(address: str, token: str | None, uid: str) -> subagents_pb2.GetSubagentsResponse:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    async with aio.insecure_channel(address) as channel:
        stub = subagents_pb2_grpc.SubagentsStub(channel)
        response: subagents_pb2.GetSubagentsResponse = await stub.GetSubagents(
            subagents_pb2.GetSubagentsRequest(session=uid), metadata=metadata, timeout=30
        )
        return response


async def test_links_need_the_reader_role_on_the_sessions_project(tmp_path: Path) -> None:
    tokens = tmp_path / "principals.json"
    tokens.write_text(json.dumps(PRINCIPALS))
    config = HostConfig(listen="127.0.0.1:0", journal="memory:", auth_tokens=str(tokens))
    async with serving(config) as (address, *_):
        async with SessionsClient.connect(address, metadata=(("authorization", f"Bearer {WRITER}"),)) as w:
            uid = (await w.create_session(harness="echo")).metadata.uid
        seen = await links(address, READER, uid)
        assert not seen.HasField("parent") and list(seen.children) == []
        with pytest.raises(grpc.aio.AioRpcError) as hidden:
            await links(address, OTHER, uid)
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await links(address, OTHER, "sess-000000000000000000000000")
        assert hidden.value.code() == unknown.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as nobody:
            await links(address, None, uid)
        assert nobody.value.code() == grpc.StatusCode.UNAUTHENTICATED
