"""Contract suite of the tool runner: `Tool.invoke` (tool/types.py) and the loop's base
tool handler (agent/loop.py), for every kind of tool function the runner takes — an
async function (run on the event loop), a sync one (run in a daemon thread,
tool/threads.py), an object with an async `__call__`, and a sync function returning an
awaitable. Whatever the kind, `invoke` validates the arguments, never raises (failures,
time-outs and unusable results become error results with their outcome) but can be
cancelled; the loop answers a call of a tool the agent does not have with an error result.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from hango_worker.testing.inmem import run_agent
from hango_worker.tool.types import Tool, ToolContext, ToolResult
from tests.helpers import agent, call, scripted

Body = Callable[[dict[str, Any], ToolContext], Any]
KINDS = ["async", "sync", "async-callable", "sync-returning-awaitable"]
CTX = ToolContext(run_id="run-1", tenant_id="tenant-1", tool_use_id="toolu_1")
SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "additionalProperties": False,
}
VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


class _AsyncCallable:
    def __init__(self, body: Body) -> None:
        self.body = body

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        return self.body(args, ctx)


def as_kind(kind: str, body: Body) -> Callable[[dict[str, Any], ToolContext], Any]:
    """`body` as a tool function of that kind."""
    if kind == "sync":
        return body
    if kind == "async-callable":
        return _AsyncCallable(body)

    async def run_async(args: dict[str, Any], ctx: ToolContext) -> Any:
        return body(args, ctx)

    if kind == "async":
        return run_async

    def awaitable(args: dict[str, Any], ctx: ToolContext) -> Awaitable[Any]:
        return run_async(args, ctx)

    return awaitable


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make(kind: str) -> Callable[..., Tool]:
    def tool(body: Body, name: str = "probe", **kw: Any) -> Tool:
        return Tool(name, "A probe.", SCHEMA, as_kind(kind, body), **kw)

    return tool


def returns(value: Any) -> Body:
    return lambda args, ctx: value


@pytest.mark.parametrize(
    ("value", "content"),
    [
        ("plain text", "plain text"),
        ({"a": [1, 2], "é": None}, '{"a": [1, 2], "é": null}'),
        (42, "42"),
        (None, "null"),
        ("a\x00b", "a\ufffdb"),  # NUL is replaced: Postgres refuses it in text
    ],
)
async def test_a_value_becomes_a_text_result(make: Any, value: Any, content: str) -> None:
    got = await make(returns(value)).invoke({}, CTX)
    assert got == ToolResult(content)
    assert got.outcome_label == "ok"


async def test_a_tool_result_is_returned_as_it_is(make: Any) -> None:
    made = ToolResult.error("no such row", "error")
    assert await make(returns(made)).invoke({}, CTX) is made


async def test_content_blocks_become_a_block_result(make: Any) -> None:
    blocks = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    got = await make(returns(blocks)).invoke({}, CTX)
    assert not got.is_error and got.blocks == blocks
    assert got.to_dict()["blocks"] == blocks


async def test_the_arguments_and_context_reach_the_tool(make: Any) -> None:
    def body(args: dict[str, Any], ctx: ToolContext) -> str:
        return f"{args['text']} {ctx.run_id} {ctx.tenant_id} {ctx.tool_use_id} {VAR.get()}"

    token = VAR.set("the run's context")  # the run's span and log context reach the tool
    try:
        got = await make(body).invoke({"text": "hi"}, CTX)
    finally:
        VAR.reset(token)
    assert got.content == "hi run-1 tenant-1 toolu_1 the run's context"


async def test_invalid_arguments_are_an_error_and_the_tool_is_not_called(make: Any) -> None:
    called: list[Any] = []
    tool = make(lambda args, ctx: called.append(args))
    got = await tool.invoke({"text": 7, "extra": True}, CTX)
    assert got.is_error and got.outcome == "invalid_arguments"
    assert got.content.startswith("invalid arguments for tool 'probe': ")
    assert called == []


async def test_an_exception_is_an_error_result(make: Any) -> None:
    def body(args: dict[str, Any], ctx: ToolContext) -> str:
        raise ValueError("the disk is full")

    got = await make(body).invoke({}, CTX)
    assert got == ToolResult.error("tool 'probe' failed: ValueError: the disk is full")
    assert got.outcome == "crashed"


async def test_an_unusable_value_is_an_error_result(make: Any) -> None:
    got = await make(returns(object())).invoke({}, CTX)
    assert got.is_error and got.outcome == "bad_result"
    assert got.content.startswith("tool 'probe' returned an unusable result: ")


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """Holds a hanging tool; opened after the test, so its thread can end."""
    event = threading.Event()
    yield event
    event.set()


def hangs(kind: str, gate: threading.Event) -> Callable[[dict[str, Any], ToolContext], Any]:
    """A tool function that does not return until `gate` opens (never, in the test)."""
    if kind == "sync":
        return lambda args, ctx: gate.wait()

    async def wait(args: dict[str, Any], ctx: ToolContext) -> Any:
        await asyncio.Event().wait()

    return wait


async def test_a_call_past_its_time_limit_is_an_error_result(
    kind: str, gate: threading.Event
) -> None:
    tool = Tool("slow", "Never ends.", SCHEMA, hangs(kind, gate), timeout_s=0.05)
    got = await tool.invoke({}, CTX)
    assert got.is_error and got.outcome == "timeout"
    assert got.content == (
        "tool 'slow' did not finish within its time limit of 0.05 s; "
        "it was stopped and its outcome is unknown"
    )


async def test_a_call_can_be_cancelled(kind: str, gate: threading.Event) -> None:
    tool = Tool("slow", "Never ends.", SCHEMA, hangs(kind, gate))
    task = asyncio.ensure_future(tool.invoke({}, CTX))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_sync_tool_runs_off_the_event_loop() -> None:
    loop_thread = threading.current_thread()
    got = await Tool("where", "", SCHEMA, lambda a, c: threading.current_thread().name).invoke(
        {}, CTX
    )
    assert got.content.startswith("hango-tool_") and got.content != loop_thread.name


async def test_through_the_loop_every_call_gets_its_result(make: Any) -> None:
    """The loop's base tool handler: a call of the agent's tool is invoked; one the
    agent lists but no registry holds is answered "unknown tool"."""

    def crash(args: dict[str, Any], ctx: ToolContext) -> str:
        raise RuntimeError("bug")

    tools = [make(lambda a, c: f"echo {a['text']}", "echo"), make(crash, "crash")]
    turn = {"tool_calls": [call("echo", text="hi"), call("crash"), call("ghost")]}
    a = agent(tools=["echo", "crash", "ghost"])
    out, _, io = await run_agent(a, scripted(turn, {"text": "done"}), tools=tools, stack=[])
    assert out.status == "succeeded"
    got = [io.tool_results[f"toolu_s0000_{i}"] for i in range(3)]
    assert got[0] == ToolResult("echo hi")
    assert got[1] == ToolResult.error("tool 'crash' failed: RuntimeError: bug")
    assert got[2].is_error and got[2].content == "unknown tool 'ghost' (available: echo, crash)"
