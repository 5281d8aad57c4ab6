"""A calculator as an MCP server (the official `mcp` SDK's MCPServer), for examples/mcp_calculator_smollm2.yaml.

    python -m examples.mcp.calculator_server          # stdio: what rollout.tools.mcp starts

Any MCP server works the same way; this one is small so that the example needs nothing else.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("calculator", log_level="CRITICAL")


@server.tool()
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


if __name__ == "__main__":
    server.run("stdio")
