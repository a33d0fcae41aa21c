"""MCP tools: an agent's MCP servers (tool/mcp_config.py) opened for one run attempt
through the official `mcp` SDK (stdio, streamable HTTP), their tools as `Tool`s named
`mcp__<server>__<tool>` (docs/operations.md, "MCP tools").

`open_mcp` opens every server at attempt start, lists its tools (sorted by name, so
the request's tool list, the prompt cache's prefix, is stable), and closes them all
when the attempt ends, also on a cancel or shutdown. Each session lives in a task of
its own: a server that crashes or hangs up ends that task only, never the run; its
calls are then error results naming the server. A server that cannot be opened leaves
its tools out of the attempt (`McpTools.listing` says why, the run records it).

MCP tools are not idempotent (`Tool.idempotent` False): a call a crash interrupted is
answered "interrupted", never re-run blindly. Every call carries the run's tool_use id
in `_meta` (IDEMPOTENCY_KEY), for a server that deduplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx2
import mcp_types
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from hango_worker.telemetry import metrics
from hango_worker.telemetry.tracing import current_tool_call
from hango_worker.tool.mcp_config import McpServer, SecretError, tool_name
from hango_worker.tool.types import TOOL_NAME, Tool, ToolContext, ToolResult

log = logging.getLogger(__name__)

IDEMPOTENCY_KEY = "hango/idempotency_key"  # `_meta` key: the call's tool_use id
RUN_KEY = "hango/run_id"  # `_meta` key: the run's id
CLOSE_S = 5.0  # how long a session gets to close before its task is cancelled
# our own timeout answers first; Tool.invoke's (timeout_s + this) is the backstop
BACKSTOP_S = 5.0


class McpServerError(RuntimeError):
    """A server could not be reached, or answered a call with a protocol error."""


class _Session:
    """One server's session, owned by a task of its own (anyio's task groups in the
    SDK end the task that entered them when the connection fails: that is this task,
    never the run's)."""

    def __init__(self, server: McpServer, environ: Mapping[str, str]) -> None:
        self.server = server
        self.environ = environ
        self.session: ClientSession | None = None
        self.broken: str | None = None
        self.gate = asyncio.Semaphore(server.max_concurrency)
        self._ready: asyncio.Future[list[mcp_types.Tool]] = (
            asyncio.get_running_loop().create_future()
        )
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> list[mcp_types.Tool]:
        """Start the session and list its tools (McpServerError, naming the server)."""
        self._task = asyncio.create_task(self._own(), name=f"mcp-{self.server.name}")
        try:
            return await asyncio.wait_for(asyncio.shield(self._ready), self.server.open_timeout_s)
        except TimeoutError:
            raise McpServerError(
                f"did not answer within {self.server.open_timeout_s:g} s while opening"
            ) from None

    async def _own(self) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(await self._transport(stack))
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                listed = await _list_all(session)
                self.session = session
                self._ready.set_result(listed)
                await self._closing.wait()
        except (Exception, asyncio.CancelledError) as e:
            why = _why(e)
            if not self._ready.done():
                self._ready.set_exception(McpServerError(why))
            elif not self._closing.is_set():
                self.broken = why
                log.warning("MCP server %r closed: %s", self.server.name, why)
        finally:
            self.session = None
            if not self._ready.done():
                self._ready.set_exception(McpServerError("closed while opening"))

    async def _transport(
        self, stack: contextlib.AsyncExitStack
    ) -> contextlib.AbstractAsyncContextManager[Any]:
        s = self.server
        if s.url is not None:  # the SDK's recommended timeouts; a call's own is timeout_s
            headers = s.resolved(s.headers, self.environ)
            client = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0))
            await stack.enter_async_context(client)
            return streamable_http_client(s.url, http_client=client)
        assert s.command is not None
        env = s.resolved(s.env, self.environ)
        return stdio_client(StdioServerParameters(command=s.command, args=s.args, env=env))

    async def close(self) -> None:
        """End the session (its process, its HTTP session) within CLOSE_S, or cancel it."""
        self._closing.set()
        task = self._task
        if task is not None and not task.done():
            if not self._ready.done():
                task.cancel()  # still opening (it timed out): nothing to close politely
            done, _ = await asyncio.wait({task}, timeout=CLOSE_S)
            if not done:
                task.cancel()
                await asyncio.wait({task}, timeout=CLOSE_S)
        if not self._ready.done():
            self._ready.cancel()
        elif not self._ready.cancelled():
            self._ready.exception()  # consumed: a failed open was reported already

    async def call(self, tool: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        s = self.server
        note = current_tool_call()
        if note is not None:
            note.span.set_attribute("hango.mcp.server", s.name)
            note.span.set_attribute("hango.mcp.tool", tool)
        meta = mcp_types.RequestParamsMeta()
        meta[IDEMPOTENCY_KEY] = ctx.tool_use_id  # type: ignore[literal-required]
        meta[RUN_KEY] = ctx.run_id  # type: ignore[literal-required]
        try:
            async with asyncio.timeout(s.timeout_s):
                async with self.gate:
                    session = self._live()
                    result = await session.call_tool(tool, args, meta=meta)
        except TimeoutError:
            return _answer(s.name, "timeout", _timeout(s, tool))
        except McpServerError as e:
            return _answer(s.name, "unavailable", f"MCP server {s.name!r} is unavailable: {e}")
        except Exception as e:
            message = f"MCP server {s.name!r} failed the call to {tool!r}: {_why(e)}"
            return _answer(s.name, "failed", message)
        out = result_of(result)
        metrics.MCP_CALLS.labels(s.name, "error" if out.is_error else "ok").inc()
        return out

    def _live(self) -> ClientSession:
        if self.session is None:
            raise McpServerError(self.broken or "its session is closed")
        return self.session


def _timeout(s: McpServer, tool: str) -> str:
    return (
        f"MCP server {s.name!r} did not answer the call to {tool!r} within {s.timeout_s:g} s; "
        "it was cancelled and its outcome is unknown"
    )


def _answer(server: str, outcome: str, message: str) -> ToolResult:
    metrics.MCP_CALLS.labels(server, outcome).inc()
    return ToolResult.error(message, "timeout" if outcome == "timeout" else None)


def _why(e: BaseException) -> str:
    if isinstance(e, BaseExceptionGroup) and e.exceptions:
        return _why(e.exceptions[0])
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


async def _list_all(session: ClientSession) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for _ in range(100):  # pages
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return sorted(tools, key=lambda t: t.name)


def result_of(result: mcp_types.CallToolResult) -> ToolResult:
    """An MCP call's result as a ToolResult: text and image content as blocks (a
    single text as plain text), anything else as its JSON; `is_error` kept."""
    blocks: list[dict[str, Any]] = []
    for item in result.content:
        if isinstance(item, mcp_types.TextContent):
            blocks.append({"type": "text", "text": item.text})
        elif isinstance(item, mcp_types.ImageContent):
            source = {"type": "base64", "media_type": item.mime_type, "data": item.data}
            blocks.append({"type": "image", "source": source})
        else:
            blocks.append({"type": "text", "text": item.model_dump_json(exclude_none=True)})
    if not blocks and result.structured_content is not None:
        return ToolResult(result.structured_content, result.is_error)
    if all(b["type"] == "text" for b in blocks):
        return ToolResult("\n".join(b["text"] for b in blocks), result.is_error)
    try:
        return ToolResult.of_blocks(blocks, result.is_error)
    except ValueError as e:  # an image type the API does not take
        return ToolResult.error(f"the MCP tool's result is unusable: {e}", "bad_result")


@dataclass(slots=True)
class McpTools:
    """One attempt's MCP tools: those offered (sorted by name), and per server the
    names it listed (`listing`) or why it could not be opened (`errors`)."""

    tools: list[Tool] = field(default_factory=list)
    listing: dict[str, list[str]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def names(self) -> list[str]:
        return [t.name for t in self.tools]

    def record(self, private: dict[str, Any]) -> dict[str, Any]:
        """The `mcp_tools` event's payload: per server its tools and their digest, and
        whether they changed since the run's previous attempt (its digest is kept in
        `private`, the run state's `private["mcp"]`), or the error that left it out."""
        kept = private.get("mcp")
        before: dict[str, Any] = kept if isinstance(kept, dict) else {}
        servers: dict[str, Any] = {}
        digests: dict[str, str] = {}
        for name, tools in self.listing.items():
            digest = hashlib.sha256("\n".join(tools).encode()).hexdigest()[:16]
            digests[name] = digest
            changed = name in before and before[name] != digest
            servers[name] = {"tools": tools, "digest": digest, "changed": changed}
        for name, error in self.errors.items():
            servers[name] = {"error": error}
            if name in before:
                digests[name] = before[name]  # unknown now: compared at the next attempt
        private["mcp"] = digests
        return {"servers": servers}


def _tool(sess: _Session, listed: mcp_types.Tool) -> Tool | None:
    name = tool_name(sess.server.name, listed.name)
    if not TOOL_NAME.match(name):
        log.warning("MCP tool %r left out: the name is not one the API accepts", name)
        return None
    tool = listed.name

    async def call(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await sess.call(tool, args, ctx)

    schema = dict(listed.input_schema or {})
    schema.setdefault("type", "object")
    made = Tool(
        name,
        listed.description or listed.title or listed.name,
        schema,
        call,
        idempotent=False,
        timeout_s=sess.server.timeout_s + BACKSTOP_S,
    )
    try:
        made.check()
    except ValueError as e:
        log.warning("MCP tool %r left out: %s", name, e)
        return None
    return made


@contextlib.asynccontextmanager
async def open_mcp(
    servers: Sequence[McpServer], agent_tools: Sequence[str], environ: Mapping[str, str]
) -> AsyncIterator[McpTools]:
    """Open `servers` (at once), offer the tools each allows to an agent listing
    `agent_tools`, and close them all on exit. Never raises for a server: one that
    cannot be opened (down, a secret not set) is in `errors`, its tools left out."""
    sessions = [_Session(s, environ) for s in servers]
    out = McpTools()
    try:
        opened = await asyncio.gather(*(_open(s) for s in sessions))
        for sess, listed in zip(sessions, opened, strict=True):
            name = sess.server.name
            if isinstance(listed, str):
                out.errors[name] = listed
                continue
            out.listing[name] = [t.name for t in listed]
            offered = [t for t in listed if sess.server.offers(t.name, agent_tools)]
            out.tools.extend(t for t in (_tool(sess, t) for t in offered) if t is not None)
        out.tools.sort(key=lambda t: t.name)
        yield out
    finally:
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)


async def _open(sess: _Session) -> list[mcp_types.Tool] | str:
    try:
        return await sess.open()
    except (McpServerError, SecretError) as e:
        why = f"MCP server {sess.server.name!r} could not be opened: {e}"
        log.warning("%s", why)
        return why
