"""A small MCP server the MCP executor tests launch over stdio (``python mcp_tool_server.py``).

Its tools exercise each result shape: structured output, plain text, an image, a failure,
and a file-appending effect for the dedup test.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mcp.server.mcpserver import Image, MCPServer

server = MCPServer("agentsessions-test-tools")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool(structured_output=False)
def shout(text: str) -> str:
    """Upper-case the text."""
    return text.upper()


@server.tool()
def pixel() -> Image:
    """A one-byte 'image'."""
    return Image(data=b"\x89", format="png")


@server.tool()
def fail(reason: str) -> str:
    """Always fails."""
    raise ValueError(reason)


@server.tool()
def append_marker(path: str, line: str) -> str:
    """Append a line to a file (the effect the dedup test counts)."""
    with open(path, "a", encoding="utf-8") as file:
        file.write(line + "\n")
    return "appended"


@server.tool()
def whisper(secret: str) -> str:
    """Write its argument to stderr, as a chatty server's debug output would."""
    print(f"debug: got secret={secret}", file=sys.stderr, flush=True)
    return "ok"


if __name__ == "__main__":
    pid_file = os.environ.get("MCP_TEST_PID_FILE")
    if pid_file:
        Path(pid_file).write_text(str(os.getpid()), encoding="utf-8")
    sys.exit(server.run("stdio"))
