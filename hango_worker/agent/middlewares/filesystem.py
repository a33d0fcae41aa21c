"""Filesystem: big tool results offloaded to run files, and tools over those files.

ToolWrapper: a successful tool result larger than the threshold (AgentConfig
`offload_threshold_bytes`, UTF-8 bytes) is stored once at `offload_path(call id)`
and the model sees `pointer_text(...)` with a short head (agent/offload.py, the
one pointer format). Results of the file tools themselves are never offloaded
(their pages are bounded instead), nor are error results.

ToolProvider: `ls`, `read_file`, `grep`, `write_file`, `edit_file` (limits in
agent/files.py), each offered only when the agent lists it.

Durability (docs/design.md §12): writes never go to storage from here. They are
appended to the `State.file_writes` outbox, which the durability port stores in
the same fenced statement as the tool result that produced them; reads go to
the `FileStore` and see the outbox first, so a write is readable at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, Field

from hango_worker.agent import files as f
from hango_worker.agent.middleware import StackContext, ToolCallRequest, ToolHandler
from hango_worker.agent.offload import OFFLOAD_DIR, offload_path, pointer_text
from hango_worker.agent.ports import FileInfo, FileStore
from hango_worker.agent.state import FileWrite, State
from hango_worker.provider.sanitize import clean_text, record_sanitized
from hango_worker.telemetry import metrics
from hango_worker.telemetry.tracing import middleware_event
from hango_worker.tool.types import Tool, ToolContext, ToolResult

DEFAULT_OFFLOAD_THRESHOLD_BYTES = 20_000
OFFLOADED_EVENT = "middleware.tool_result_offloaded"
FILE_TOOLS = ("ls", "read_file", "grep", "write_file", "edit_file")


class FilesystemConfig(BaseModel):
    """The agent's setting (`agents.config`, a section of AgentConfig)."""

    # tool results larger than this (UTF-8 bytes) go to a run file (None: 20_000)
    offload_threshold_bytes: int | None = Field(default=None, ge=1_000, le=100_000_000)


_STR = {"type": "string"}
_PATH = {"type": "string", "description": "absolute path, e.g. /notes/plan.md"}


def _schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


SPECS: dict[str, tuple[str, dict[str, Any]]] = {
    "ls": (
        "List the run's files (path and size in bytes) under a directory (default /). "
        f"Large tool results are stored under {OFFLOAD_DIR}/.",
        _schema({"path": {"type": "string", "description": "directory, default /"}}, []),
    ),
    "read_file": (
        "Read a run file as numbered lines (numbers start at 1). offset is the first line "
        "to show, 0-based (offset 0 = line 1); limit is how many lines (default "
        f"{f.DEFAULT_LIMIT}, at most {f.MAX_LIMIT}). Lines longer than {f.LINE_WIDTH} "
        "characters are cut; a page that stops early says which offset reads on.",
        _schema(
            {"path": _PATH, "offset": {"type": "integer"}, "limit": {"type": "integer"}},
            ["path"],
        ),
    ),
    "grep": (
        "Search the run's files for lines matching a regular expression (Python re "
        "syntax), in one file or under a directory (default: all files). Shows "
        f"path:line: text, at most {f.MAX_GREP_MATCHES} matches; a search is stopped "
        f"after {f.GREP_TIMEOUT_S:g} s.",
        _schema({"pattern": _STR, "path": _PATH}, ["pattern"]),
    ),
    "write_file": (
        f"Create or replace a run file with the given content (at most {f.MAX_FILE_BYTES} "
        f"bytes). Files under {OFFLOAD_DIR}/ are read-only.",
        _schema({"path": _PATH, "content": _STR}, ["path", "content"]),
    ),
    "edit_file": (
        "Replace old_string with new_string in a run file. old_string must occur exactly "
        "once, unless replace_all is true (then every occurrence is replaced).",
        _schema(
            {
                "path": _PATH,
                "old_string": _STR,
                "new_string": _STR,
                "replace_all": {"type": "boolean"},
            },
            ["path", "old_string", "new_string"],
        ),
    ),
}

Op = Callable[[State, dict[str, Any], ToolContext], Awaitable[str]]


class Filesystem:
    """ToolWrapper + ToolProvider over the run's files (see the module docstring)."""

    name = "filesystem"

    def __init__(
        self, files: FileStore | None, threshold_bytes: int = DEFAULT_OFFLOAD_THRESHOLD_BYTES
    ) -> None:
        self.files = files
        self.threshold = threshold_bytes
        self._bound: tuple[State, list[Tool]] | None = None
        # the last file read from the store, split into lines (pages of one big file)
        self._cache: tuple[str, list[str]] | None = None

    # -- offloading ----------------------------------------------------------------------

    async def wrap_tool_call(self, req: ToolCallRequest, next: ToolHandler) -> ToolResult:
        result = await next(req)
        if result.is_error or req.call.name in FILE_TOOLS:
            return result
        content = result.content
        if len(content) <= self.threshold // 4:  # ≤ 4 UTF-8 bytes a character: small
            return result
        size = f.utf8_size(content)
        if size <= self.threshold:
            return result
        path = offload_path(req.call.id)
        self._write(req.state, FileWrite(path, content, size, req.call.id))
        middleware_event(
            OFFLOADED_EVENT,
            self.name,
            "tool result larger than offload_threshold_bytes",
            **{
                "hango.offload.size_bytes": size,
                "hango.offload.path": path,
                "gen_ai.tool.name": req.call.name,
            },
        )
        metrics.OFFLOADED_BYTES.inc(size)
        record_sanitized("tool_result", result.sanitized)
        return ToolResult(pointer_text(path, size, f.head(content)), outcome=result.outcome)

    # -- the tools -----------------------------------------------------------------------

    def provide_tools(self, state: State) -> list[Tool]:
        if self._bound is None or self._bound[0] is not state:
            ops: dict[str, Op] = {
                "ls": self._ls,
                "read_file": self._read_file,
                "grep": self._grep,
                "write_file": self._write_file,
                "edit_file": self._edit_file,
            }
            tools = [self._tool(state, name, op) for name, op in ops.items()]
            self._bound = (state, tools)
        return self._bound[1]

    @staticmethod
    def _tool(state: State, name: str, op: Op) -> Tool:
        async def call(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
            try:
                return ToolResult(await op(state, args, ctx))
            except f.FileError as e:
                return ToolResult.error(f"{name}: {e}")

        description, schema = SPECS[name]
        # idempotent: a call whose result was not recorded wrote nothing (the file rides
        # on the result's commit), so running it again after a crash is exactly right
        # sequential: a write changes what the later calls of the response read
        writes = name in ("write_file", "edit_file")
        return Tool(name, description, schema, call, idempotent=True, sequential=writes)

    async def _ls(self, state: State, args: dict[str, Any], ctx: ToolContext) -> str:
        directory = f.norm_path(args.get("path") or "/", directory=True)
        found = [i for i in await self._list(state) if f.in_directory(i.path, directory)]
        if not found:
            return f"no files under {directory}"
        rows = [f"{i.path}\t{i.size} bytes" for i in found[: f.MAX_LS_ENTRIES]]
        if len(found) > f.MAX_LS_ENTRIES:
            rows.append(
                f"[{len(found) - f.MAX_LS_ENTRIES} more files not shown; list a subdirectory]"
            )
        return "\n".join(rows)

    async def _read_file(self, state: State, args: dict[str, Any], ctx: ToolContext) -> str:
        path = f.norm_path(args.get("path"))
        lines = await self._lines(state, path)
        if lines == [""]:
            return f"{path} is empty"
        return f.page(lines, args.get("offset"), args.get("limit"))

    async def _grep(self, state: State, args: dict[str, Any], ctx: ToolContext) -> str:
        rx = f.compile_pattern(args.get("pattern"))
        where = f.norm_path(args.get("path") or "/", directory=True)
        paths = [i.path for i in await self._list(state) if f.in_directory(i.path, where)]
        if not paths:
            return f"no files under {where}"
        contents = [(p, await self._content(state, p) or "") for p in paths]
        return await f.grep_isolated(rx, contents)

    async def _write_file(self, state: State, args: dict[str, Any], ctx: ToolContext) -> str:
        path = self._writable(args.get("path"))
        content = args.get("content")
        if not isinstance(content, str):
            raise f.FileError("content must be a string")
        existed = await self._content(state, path) is not None
        size = self._store(state, path, content, ctx)
        return f"{'replaced' if existed else 'wrote'} {path} ({size} bytes)"

    async def _edit_file(self, state: State, args: dict[str, Any], ctx: ToolContext) -> str:
        path = self._writable(args.get("path"))
        content = await self._content(state, path)
        if content is None:
            raise f.FileError(f"{path} does not exist; create it with write_file")
        old, new = args.get("old_string"), args.get("new_string")
        edited, n = f.edit(content, path, old, new, args.get("replace_all"))
        size = self._store(state, path, edited, ctx)
        return (
            f"edited {path}: {n if args.get('replace_all') is True else 1} replaced ({size} bytes)"
        )

    # -- storage: reads see the outbox first; writes go to the outbox -------------------

    @staticmethod
    def _writable(raw: Any) -> str:
        path = f.norm_path(raw)
        if f.in_directory(path, OFFLOAD_DIR):
            raise f.FileError(f"{path} is read-only: files under {OFFLOAD_DIR}/ are tool results")
        return path

    def _store(self, state: State, path: str, content: str, ctx: ToolContext) -> int:
        content, n = clean_text(content)
        record_sanitized("run_file", n)
        size = f.utf8_size(content)
        if size > f.MAX_FILE_BYTES:
            raise f.FileError(
                f"the content is {size} bytes; one file holds at most {f.MAX_FILE_BYTES} "
                "bytes (split it into several files); nothing was written"
            )
        self._write(state, FileWrite(path, content, size, ctx.tool_use_id))
        return size

    def _write(self, state: State, w: FileWrite) -> None:
        state.file_writes.append(w)
        if self._cache is not None and self._cache[0] == w.path:
            self._cache = None

    async def _content(self, state: State, path: str) -> str | None:
        for w in reversed(state.file_writes):
            if w.path == path:
                return w.content
        if self.files is None:
            return None
        return await self.files.get_file(path)

    async def _lines(self, state: State, path: str) -> list[str]:
        pending = any(w.path == path for w in state.file_writes)
        if not pending and self._cache is not None and self._cache[0] == path:
            return self._cache[1]
        content = await self._content(state, path)
        if content is None:
            raise f.FileError(f"{path} does not exist; ls lists the run's files")
        lines = content.split("\n")
        if not pending:
            self._cache = (path, lines)
        return lines

    async def _list(self, state: State) -> list[FileInfo]:
        found = {i.path: i for i in (await self.files.list_files() if self.files else [])}
        for w in state.file_writes:
            found[w.path] = FileInfo(w.path, w.size, w.tool_use_id)
        return sorted(found.values(), key=lambda i: i.path)


def build(ctx: StackContext) -> Filesystem:
    own = ctx.settings(FilesystemConfig).offload_threshold_bytes
    return Filesystem(ctx.files, own or DEFAULT_OFFLOAD_THRESHOLD_BYTES)
