"""A small MCP server for the MCP tool tests (mcp 2.x MCPServer, FastMCP's successor).

    python mcp_server_example.py                       # stdio
    python mcp_server_example.py http PORT [TOKEN_FILE] # streamable HTTP on 127.0.0.1:PORT/mcp
    python mcp_server_example.py hostile               # stdio: too many tools, one with a huge schema
"""

from __future__ import annotations

import os
import sys
import uuid

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError


def build(hostile: bool = False) -> MCPServer:
    server = MCPServer("example", log_level="CRITICAL")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def echo(text: str) -> str:
        """Echo the text back."""
        return text

    @server.tool()
    def fail(reason: str) -> str:
        """Always fails with the given reason."""
        raise ToolError(f"refused: {reason}")

    @server.tool()
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    started = uuid.uuid4().hex

    @server.tool()
    def instance() -> str:
        """A random id drawn when this server started (in a sandbox every server is pid 2)."""
        return started

    if hostile:
        def huge(x: int) -> int:
            return x

        server.add_tool(huge, name="huge", description="x" * 100_000)
        for i in range(200):
            server.add_tool(lambda: "ok", name=f"spam_{i:03d}", description=f"spam tool {i}")
    return server


def main(argv: list[str]) -> None:
    mode = argv[1] if len(argv) > 1 else "stdio"
    if mode == "http":
        port = int(argv[2])
        token = open(argv[3]).read().strip() if len(argv) > 3 else ""
        serve_http(build(), port, token)
    else:
        build(hostile=mode == "hostile").run("stdio")


def serve_http(server: MCPServer, port: int, token: str) -> None:
    import uvicorn

    app = server.streamable_http_app()
    if token:
        inner = app

        async def app(scope, receive, send):  # a bearer-token check in front of the MCP app
            if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != f"Bearer {token}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
            await inner(scope, receive, send)

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(sys.argv)
