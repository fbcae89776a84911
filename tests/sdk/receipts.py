"""The ways a decided approval's receipt can end, for the tests on both sides of Connect."""

from __future__ import annotations

import pytest

from agentsessions.v1 import common_pb2

Code = common_pb2.ToolResult

# (approved, receipt code, is_error): approved and run, approved and failed, denied.
decided_receipts = pytest.mark.parametrize(
    ("approved", "code", "is_error"),
    [
        (True, Code.CODE_UNSPECIFIED, False),
        (True, Code.EXECUTOR_ERROR, True),
        (False, Code.APPROVAL_DENIED, True),
    ],
    ids=["success", "executor-error", "denied"],
)
