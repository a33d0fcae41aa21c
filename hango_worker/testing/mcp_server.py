"""A small MCP server to try MCP tools offline (docs/operations.md, "MCP tools").

    python -m hango_worker.testing.mcp_server                   # stdio
    python -m hango_worker.testing.mcp_server --http --port 8765  # streamable HTTP

Its tools: `echo`, `add`, `slow` (sleeps), `busy` (sleeps, then answers how many
of its calls ran at once at most), `fail` (always an error result), `meta`
(the `_meta` its own call carried: the idempotency key hango sends), `pixel` (a
1x1 PNG, an image result), `headers` (the HTTP headers of its own request, over
HTTP: what a secret reference resolved to), `pid` (its process id) and `crash` (the
process ends at once). `HANGO_MCP_DEMO_EXTRA=1` adds a tool
`extra` (a server whose list changed between two attempts).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
from typing import Any

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

# 1x1 transparent PNG
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


def build() -> MCPServer:
    server = MCPServer("hango-demo")
    _basic(server)
    _probes(server)
    return server


def _basic(server: MCPServer) -> None:
    """The tools a model would use: they answer, sleep, fail."""

    @server.tool(description="Answer with the text it was given.")
    def echo(text: str) -> str:
        return text

    @server.tool(description="The sum of two integers.")
    def add(a: int, b: int) -> int:
        return a + b

    @server.tool(description="Sleep for the given seconds, then answer 'done'.")
    async def slow(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "done"

    running = [0, 0]  # calls of `busy` running now, the most at once so far

    @server.tool(
        description="Sleep for the given seconds; answer the most calls of this tool "
        "that ran at once so far."
    )
    async def busy(seconds: float) -> int:
        running[0] += 1
        running[1] = max(running)
        await asyncio.sleep(seconds)
        running[0] -= 1
        return running[1]

    @server.tool(description="Always fails with the given message.")
    def fail(message: str) -> str:
        raise ToolError(message)


def _probes(server: MCPServer) -> None:
    """The tools a test reads: what a call carried, the server's process, its image."""

    @server.tool(description="The _meta object this call carried, as JSON.")
    def meta(ctx: Context) -> dict[str, Any]:
        return dict(ctx.request_context.meta or {})

    @server.tool(description="A 1x1 PNG image.")
    def pixel() -> Image:
        return Image(data=PIXEL, format="png")

    @server.tool(description="The HTTP headers of this call's request (HTTP only).")
    def headers(ctx: Context) -> dict[str, str]:
        request = getattr(ctx.request_context, "request", None)
        found = getattr(request, "headers", None)
        return {k.lower(): v for k, v in dict(found or {}).items()}

    @server.tool(description="This server's process id.")
    def pid() -> int:
        return os.getpid()

    @server.tool(description="End this server's process at once (a server that crashes).")
    def crash() -> str:
        os._exit(3)

    if os.environ.get("HANGO_MCP_DEMO_EXTRA") == "1":

        @server.tool(description="Only listed when HANGO_MCP_DEMO_EXTRA=1.")
        def extra() -> str:
            return "extra"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hango_worker.testing.mcp_server")
    parser.add_argument("--http", action="store_true", help="streamable HTTP, not stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    server = build()
    if args.http:
        server.run("streamable-http", host=args.host, port=args.port)
    else:
        server.run()


if __name__ == "__main__":
    main()
