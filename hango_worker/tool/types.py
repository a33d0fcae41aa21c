"""Tool and ToolResult."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from hango_worker.provider.content import (
    Blob,
    blob_ref,
    check_input_blocks,
    media_block,
    result_block_types,
    result_text,
    store_form,
)
from hango_worker.provider.sanitize import clean_text
from hango_worker.provider.types import ToolResultBlock, ToolSpec
from hango_worker.tool.threads import DaemonThreads
from hango_worker.vocab import ToolOutcome

# Sync tool functions run here (a thread cannot be stopped: one that hangs holds its
# thread until it returns, but never the event loop, nor the worker's exit: daemon
# threads, tool/threads.py).
TOOL_THREADS = 16
_THREADS = DaemonThreads(TOOL_THREADS, "hango-tool")
# A tool call that has not finished after this many seconds is stopped and answered
# with an error result (`Tool.timeout_s` overrides it per tool).
DEFAULT_TOOL_TIMEOUT_S = 60.0
# After a timeout or a cancel, how long a tool gets to unwind before it is abandoned.
STOP_GRACE_S = 1.0
# How a call ended, for `hango_tool_calls_total{outcome}` (bounded on purpose).
OUTCOMES = frozenset(str(o) for o in ToolOutcome)
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # what the Messages API accepts


@dataclass(slots=True, frozen=True)
class ToolResult:
    """What a tool call gave. `content` is text: anything else is JSON-encoded (a value
    that is not JSON-serialisable raises TypeError), and NUL characters and lone
    surrogates become U+FFFD (`provider/sanitize.py`); `sanitized` counts them.

    `blocks`: a result given as content blocks (text, image, document, search_result;
    checked against the SDK's types, ValueError naming the block): sent as they are,
    stored with each large image or PDF by reference (`stored`, `blobs`:
    docs/inputs-and-outputs.md); `content` is then their text (`ToolResult.of_blocks`,
    `ToolResult.of_bytes`)."""

    content: str
    is_error: bool = False
    outcome: str | None = field(default=None, compare=False)
    sanitized: int = field(default=0, compare=False, init=False)
    blocks: list[dict[str, Any]] | None = field(default=None, kw_only=True)
    stored: list[dict[str, Any]] | None = field(default=None, compare=False, init=False)
    blobs: tuple[Blob, ...] = field(default=(), compare=False, init=False)

    def __post_init__(self) -> None:
        content: Any = self.content
        if self.blocks is not None:
            text = self._take_blocks(self.blocks)
            content = content or text
        if not isinstance(content, str):
            content = as_text(content)
        clean, n = clean_text(content)
        object.__setattr__(self, "content", clean)
        object.__setattr__(self, "sanitized", n)
        if self.outcome is not None and self.outcome not in OUTCOMES:
            raise ValueError(f"unknown tool outcome {self.outcome!r}")

    def _take_blocks(self, blocks: list[dict[str, Any]]) -> str:
        if any(blob_ref(b) for b in blocks if isinstance(b, dict)):  # read back as stored
            object.__setattr__(self, "stored", blocks)
            return result_text(blocks)
        check_input_blocks(blocks, "a tool result", result_block_types())
        stored, blobs = store_form(blocks)
        object.__setattr__(self, "stored", stored)
        object.__setattr__(self, "blobs", tuple(blobs))
        return result_text(blocks)

    @classmethod
    def of_blocks(cls, blocks: list[dict[str, Any]], is_error: bool = False) -> ToolResult:
        return cls("", is_error, blocks=list(blocks))

    @classmethod
    def of_bytes(cls, data: bytes, media_type: str | None = None) -> ToolResult:
        """An image or PDF (media type from the bytes unless given) as the result."""
        return cls("", blocks=[media_block(data, media_type)])

    @classmethod
    def error(cls, message: str, outcome: str | None = None) -> ToolResult:
        return cls(content=message, is_error=True, outcome=outcome)

    @property
    def outcome_label(self) -> str:
        return self.outcome or ("error" if self.is_error else "ok")

    def to_block(self, tool_use_id: str) -> ToolResultBlock:
        if self.blocks is None:
            return ToolResultBlock(
                tool_use_id=tool_use_id, content=self.content, is_error=self.is_error
            )
        wire = self.blocks if self.stored is not self.blocks else None
        return ToolResultBlock(tool_use_id, self.content, self.is_error, None, self.stored, wire)

    def to_dict(self) -> dict[str, Any]:
        if self.stored is not None:
            return {"content": self.content, "is_error": self.is_error, "blocks": self.stored}
        return {"content": self.content, "is_error": self.is_error}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolResult:
        blocks = d.get("blocks")
        return cls(
            content=str(d.get("content", "")),
            is_error=bool(d.get("is_error", False)),
            blocks=blocks if isinstance(blocks, list) else None,
        )


def as_blocks(value: Any) -> list[dict[str, Any]] | None:
    """A tool's return value as content blocks, if it is some: bytes (an image or PDF),
    (bytes, media type), or a list of blocks of the types a tool result may hold."""
    if isinstance(value, bytes | bytearray):
        return [media_block(bytes(value))]
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], bytes):
        return [media_block(value[0], str(value[1]))]
    kinds = result_block_types()
    if (
        isinstance(value, list)
        and value
        and all(isinstance(b, dict) and b.get("type") in kinds for b in value)
    ):
        return value
    return None


def as_text(value: Any) -> str:
    """The text of a tool's non-string result: JSON (dicts, lists, numbers, None)."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        raise TypeError(
            f"a tool result must be str, ToolResult or JSON data; got {type(value).__name__}"
        ) from None


@dataclass(slots=True, frozen=True)
class ToolContext:
    """What a tool knows about the call it serves (ids for idempotency keys, logging)."""

    run_id: str
    tenant_id: str
    tool_use_id: str


# A tool function: async (run on the event loop) or sync (run in a worker thread).
ToolFn = Callable[[dict[str, Any], ToolContext], Awaitable[Any] | Any]


@dataclass(slots=True)
class Tool:
    """A callable tool. `idempotent` tools may be re-executed after a crash;
    others never are (their interrupted calls are repaired instead). `timeout_s`
    bounds one call (None: DEFAULT_TOOL_TIMEOUT_S). `sequential` tools run alone, in
    call order: the calls of one response before one finish first, the calls after it
    start after it (tools that change run state); the others may run side by side with
    the other calls of their response (docs/design.md §5.5)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    call: ToolFn
    idempotent: bool = False
    timeout_s: float | None = None
    sequential: bool = False
    _validator: Any = field(default=None, init=False, repr=False)

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.input_schema)

    @property
    def limit_s(self) -> float:
        return DEFAULT_TOOL_TIMEOUT_S if self.timeout_s is None else self.timeout_s

    def check(self) -> None:
        """Raise ValueError naming what is wrong with this tool's definition."""
        if not isinstance(self.name, str) or not TOOL_NAME.match(self.name):
            raise ValueError(f"tool name {self.name!r} must match {TOOL_NAME.pattern}")
        where = f"tool {self.name!r}"
        if not callable(self.call):
            raise ValueError(f"{where}: call is not callable")
        if not (isinstance(self.limit_s, int | float) and 0 < self.limit_s < float("inf")):
            raise ValueError(f"{where}: timeout_s must be a positive number of seconds")
        schema = self.input_schema
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise ValueError(f'{where}: input_schema must be a JSON schema with "type": "object"')
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as e:
            at = "/".join(str(p) for p in e.absolute_path) or "(root)"
            raise ValueError(f"{where}: invalid input_schema at {at}: {e.message}") from None

    def validate(self, args: Any) -> str | None:
        """None when `args` satisfies the input schema, else a message for the model."""
        if self._validator is None:
            cls = jsonschema.validators.validator_for(self.input_schema)
            self._validator = cls(self.input_schema)
        errors = sorted(self._validator.iter_errors(args), key=lambda e: list(e.path))
        if not errors:
            return None
        parts = []
        for e in errors[:3]:
            where = "/".join(str(p) for p in e.absolute_path) or "(root)"
            parts.append(f"{where}: {e.message}")
        return f"invalid arguments for tool '{self.name}': " + "; ".join(parts)

    async def invoke(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Validate, then call within the time limit. Never raises (but is cancellable):
        failures, timeouts and unusable results become error results."""
        problem = self.validate(args)
        if problem is not None:
            return ToolResult.error(problem, "invalid_arguments")
        task = asyncio.ensure_future(self._call(args, ctx))
        try:
            done = await settled(task, self.limit_s)
        except asyncio.CancelledError:
            await stop_task(task)
            raise
        if not done:
            await stop_task(task)
            return ToolResult.error(
                f"tool '{self.name}' did not finish within its time limit of {self.limit_s:g} s; "
                "it was stopped and its outcome is unknown",
                "timeout",
            )
        try:
            out = task.result()
        except (Exception, asyncio.CancelledError) as e:  # a tool's bug must not end the run
            return ToolResult.error(
                f"tool '{self.name}' failed: {type(e).__name__}: {e}", "crashed"
            )
        if isinstance(out, ToolResult):
            return out
        try:
            blocks = None if isinstance(out, str) else as_blocks(out)
            if blocks is not None:
                return ToolResult("", blocks=blocks)
            return ToolResult(content=out if isinstance(out, str) else as_text(out))
        except (TypeError, ValueError) as e:
            return ToolResult.error(
                f"tool '{self.name}' returned an unusable result: {e}", "bad_result"
            )

    async def _call(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        fn = self.call
        if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
        ):
            return await fn(args, ctx)
        # sync: never on the event loop, and in a pool of its own, so hung tools cannot
        # starve the loop's default executor (DNS lookups use it)
        context = contextvars.copy_context()  # the tool's span, the run id for logs
        out = await asyncio.get_running_loop().run_in_executor(
            _THREADS, functools.partial(context.run, fn, args, ctx)
        )
        return await out if inspect.isawaitable(out) else out


async def settled(task: asyncio.Future[Any], timeout_s: float) -> bool:
    """Whether `task` is done within `timeout_s` (it is left running if not): what
    `asyncio.wait({task}, timeout=...)` answers, with one future and one timer instead
    of its sets and per-call checks (every tool call waits here)."""
    loop = asyncio.get_running_loop()
    woken = loop.create_future()

    def wake(*_: object) -> None:
        if not woken.done():
            woken.set_result(None)

    timer = loop.call_later(timeout_s, wake)
    task.add_done_callback(wake)
    try:
        await woken
    finally:
        timer.cancel()
        task.remove_done_callback(wake)
    return task.done()


async def stop_task(task: asyncio.Future[Any], grace_s: float = STOP_GRACE_S) -> None:
    """Cancel `task` and give it `grace_s` to unwind; one that ignores the cancel is
    abandoned (it cannot hold the run up), its eventual exception consumed."""
    if task.done():
        return
    task.cancel()
    try:
        await asyncio.wait({task}, timeout=grace_s)
    finally:
        if not task.done():
            task.add_done_callback(_consume)


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
