"""Host-run tools: call checks, the executor seam, durable dedup, Python, MCP and subprocess
executors, tool profiles (classes, workspaces) and confinement.

The controller uses :func:`validate_tool_call` before journaling a host-run call's intent,
:meth:`ToolRegistry.profile` for its mode check, and :class:`ToolRegistry` to run it at most once
per (session, idempotency key).
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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
    from agentsessions.host.tools.mcp_stdio import McpExecutor, result_from_mcp
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

# Each name loads its module on first use (PEP 562): a host without tool flags imports the checks
# and the registry it runs every call through, not the Python, subprocess or MCP executors, nor the
# tools-file parser (bench/README.md, start-up).
_HOMES = {
    "Bubblewrap": "agentsessions.host.tools.confinement",
    "CallableTool": "agentsessions.host.tools.python_callable",
    "Confinement": "agentsessions.host.tools.profile",
    "DEFAULT_TOOL_TIMEOUT_S": "agentsessions.host.tools.executor",
    "DuplicateToolError": "agentsessions.host.tools.errors",
    "InvalidToolArgumentsError": "agentsessions.host.tools.errors",
    "InvalidToolCallError": "agentsessions.host.tools.errors",
    "ManagedToolExecutor": "agentsessions.host.tools.executor",
    "McpExecutor": "agentsessions.host.tools.mcp_stdio",
    "McpServerConfig": "agentsessions.host.tools.config",
    "MissingIdempotencyKeyError": "agentsessions.host.tools.errors",
    "MissingToolCallIdError": "agentsessions.host.tools.errors",
    "MissingToolExecutorError": "agentsessions.host.tools.errors",
    "PythonCallableExecutor": "agentsessions.host.tools.python_callable",
    "PythonToolConfig": "agentsessions.host.tools.config",
    "SubprocessExecutor": "agentsessions.host.tools.subprocess_executor",
    "SubprocessTool": "agentsessions.host.tools.subprocess_executor",
    "ToolConfigError": "agentsessions.host.tools.errors",
    "ToolContext": "agentsessions.host.tools.executor",
    "ToolExecutor": "agentsessions.host.tools.executor",
    "ToolExecutorStartError": "agentsessions.host.tools.errors",
    "ToolFunction": "agentsessions.host.tools.python_callable",
    "ToolProfile": "agentsessions.host.tools.profile",
    "ToolReceiptStore": "agentsessions.host.tools.executor",
    "ToolRegistry": "agentsessions.host.tools.executor",
    "ToolSpec": "agentsessions.host.tools.executor",
    "ToolsConfig": "agentsessions.host.tools.config",
    "UnmediatedToolCallError": "agentsessions.host.tools.errors",
    "WorkspaceRule": "agentsessions.host.tools.profile",
    "check_json_value": "agentsessions.host.tools.args",
    "error_result": "agentsessions.host.tools.executor",
    "import_tool_function": "agentsessions.host.tools.python_callable",
    "load_tools_file": "agentsessions.host.tools.config",
    "parse_mcp_server_flag": "agentsessions.host.tools.config",
    "parse_tool_executor_flag": "agentsessions.host.tools.config",
    "python_to_struct": "agentsessions.host.tools.args",
    "result_from_mcp": "agentsessions.host.tools.mcp_stdio",
    "result_from_return": "agentsessions.host.tools.python_callable",
    "struct_to_python": "agentsessions.host.tools.args",
    "tools_config_from_flags": "agentsessions.host.tools.config",
    "tools_config_from_mapping": "agentsessions.host.tools.config",
    "validate_tool_args": "agentsessions.host.tools.args",
    "validate_tool_call": "agentsessions.host.tools.args",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
