"""How a gRPC call made in a test ended, whatever its kind (a unary call awaited, a response
stream read to its end)."""

from __future__ import annotations

from typing import Any

import grpc
from grpc import aio


async def call_outcome(call: Any) -> tuple[grpc.StatusCode, str]:
    """The call's status code and details (``OK`` and "" when it succeeds)."""
    try:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call
    except aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""
