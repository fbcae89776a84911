"""A tool receipt store for the executor tests, without a journal."""

from __future__ import annotations

from agentsessions.v1 import common_pb2


class DictReceiptStore:
    """The two receipt methods of JournalStore, over a dict (first put wins)."""

    def __init__(self) -> None:
        self.receipts: dict[tuple[str, str], bytes] = {}

    async def get_tool_receipt(self, uid: str, idempotency_key: str) -> common_pb2.ToolResult | None:
        raw = self.receipts.get((uid, idempotency_key))
        return None if raw is None else common_pb2.ToolResult.FromString(raw)

    async def put_tool_receipt(self, uid: str, idempotency_key: str, result: common_pb2.ToolResult) -> None:
        self.receipts.setdefault((uid, idempotency_key), result.SerializeToString())
