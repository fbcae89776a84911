"""Host-run tools: call checks, the executor seam, durable dedup, Python, MCP and subprocess
executors, tool profiles (classes, workspaces) and confinement.

The controller uses :func:`validate_tool_call` before journaling a host-run call's intent,
:meth:`ToolRegistry.profile` for its mode check, and :class:`ToolRegistry` to run it at most once
per (session, idempotency key).
"""

from typing import TYPE_CHECKING

from agentsessions.host.tools.args import (
    check_json_value,
    python_to_struct,
    struct_to_python,
    validate_tool_args,
    validate_tool_call,
)
from agentsessions.host.tools.config import (
    McpServerConfig,
    PythonToolConfig,
    ToolsConfig,
    load_tools_file,
    parse_mcp_server_flag,
    parse_tool_executor_flag,
    tools_config_from_flags,
    tools_config_from_mapping,
)
from agentsessions.host.tools.confinement import Bubblewrap
from agentsessions.host.tools.errors import (
    DuplicateToolError,
    InvalidToolArgumentsError,
    InvalidToolCallError,
    MissingIdempotencyKeyError,
    MissingToolCallIdError,
    MissingToolExecutorError,
    ToolConfigError,
    ToolExecutorStartError,
    UnmediatedToolCallError,
)
from agentsessions.host.tools.executor import (
    DEFAULT_TOOL_TIMEOUT_S,
    ManagedToolExecutor,
    ToolContext,
    ToolExecutor,
    ToolReceiptStore,
    ToolRegistry,
    ToolSpec,
    error_result,
)
from agentsessions.host.tools.profile import Confinement, ToolProfile, WorkspaceRule
from agentsessions.host.tools.python_callable import (
    CallableTool,
    PythonCallableExecutor,
    ToolFunction,
    import_tool_function,
    result_from_return,
)
from agentsessions.host.tools.subprocess_executor import SubprocessExecutor, SubprocessTool

__all__ = [
    "DEFAULT_TOOL_TIMEOUT_S",
    "Bubblewrap",
    "CallableTool",
    "Confinement",
    "DuplicateToolError",
    "InvalidToolArgumentsError",
    "InvalidToolCallError",
    "ManagedToolExecutor",
    "McpExecutor",
    "McpServerConfig",
    "MissingIdempotencyKeyError",
    "MissingToolCallIdError",
    "MissingToolExecutorError",
    "PythonCallableExecutor",
    "PythonToolConfig",
    "SubprocessExecutor",
    "SubprocessTool",
    "ToolConfigError",
    "ToolContext",
    "ToolExecutor",
    "ToolExecutorStartError",
    "ToolFunction",
    "ToolProfile",
    "ToolReceiptStore",
    "ToolRegistry",
    "ToolSpec",
    "ToolsConfig",
    "UnmediatedToolCallError",
    "WorkspaceRule",
    "check_json_value",
    "error_result",
    "import_tool_function",
    "load_tools_file",
    "parse_mcp_server_flag",
    "parse_tool_executor_flag",
    "python_to_struct",
    "result_from_mcp",
    "result_from_return",
    "struct_to_python",
    "tools_config_from_flags",
    "tools_config_from_mapping",
    "validate_tool_args",
    "validate_tool_call",
]

if TYPE_CHECKING:
    from agentsessions.host.tools.mcp_stdio import McpExecutor, result_from_mcp


def __getattr__(name: str) -> object:
    # The MCP executor loads lazily: the mcp package is slow to import and only MCP users need it.
    if name in ("McpExecutor", "result_from_mcp"):
        from agentsessions.host.tools import mcp_stdio

        return getattr(mcp_stdio, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
