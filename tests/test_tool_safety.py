"""Tools cannot take the worker down: a time limit per call, cancel interrupts a running
tool, sync tools run in a thread, the calculator refuses work that would block the loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.store import repo
from hango_worker.testing.inmem import run_agent
from hango_worker.tool.builtins import CALCULATOR
from hango_worker.tool.types import Tool, ToolContext, ToolResult
from tests.conftest import SpanReader
from tests.helpers import agent, call, scripted
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle

OBJ: dict[str, Any] = {"type": "object"}
CTX = ToolContext(run_id="run-1", tenant_id="tenant-1", tool_use_id="toolu_1")


def tool_calls(name: str, outcome: str) -> float:
    v = REGISTRY.get_sample_value(
        "hango_tool_calls_total", {"gen_ai_tool_name": name, "outcome": outcome}
    )
    return v or 0.0


def results(io_or_run: Any) -> list[dict[str, Any]]:
    """Every tool_result block of a transcript (memory io messages or a stored run)."""
    msgs = (
        [m.to_dict() for m in io_or_run.messages]
        if hasattr(io_or_run, "messages")
        else io_or_run["transcript"]
    )
    return [b for m in msgs for b in m["content"] if b["type"] == "tool_result"]


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of a test, so threads a test left blocked finish."""
    ev = threading.Event()
    yield ev
    ev.set()


# -- time limit ----------------------------------------------------------------------------


async def test_a_tool_that_never_returns_is_stopped_at_its_time_limit(spans: SpanReader) -> None:
    async def forever(args: dict[str, Any], ctx: ToolContext) -> str:
        await asyncio.Event().wait()
        return "never"

    hang = Tool("hang_forever", "Never returns.", OBJ, forever, timeout_s=0.2)
    before = tool_calls("hang_forever", "timeout")
    async with asyncio.timeout(30):
        outcome, _, io = await run_agent(
            agent(tools=["hang_forever"]),
            scripted({"tool_calls": [call("hang_forever")]}, {"text": "gave up"}),
            tools=[hang],
        )
    assert outcome.status == "succeeded"
    [res] = results(io)
    assert res["is_error"] is True
    assert res["content"] == (
        "tool 'hang_forever' did not finish within its time limit of 0.2 s; "
        "it was stopped and its outcome is unknown"
    )
    assert tool_calls("hang_forever", "timeout") == before + 1
    [event] = spans.events("tool.timeout")
    assert event.attributes["hango.tool.timeout_s"] == 0.2


async def test_a_tool_that_ignores_cancellation_is_abandoned_not_awaited() -> None:
    async def stubborn(args: dict[str, Any], ctx: ToolContext) -> str:
        for _ in range(100):  # bounded: swallows cancels for a while, then gives up
            try:
                await asyncio.sleep(0.1)
            except asyncio.CancelledError:
                continue
        return "late"

    tool = Tool("stubborn", "Ignores cancellation.", OBJ, stubborn, timeout_s=0.1)
    async with asyncio.timeout(5):  # the tool itself would run 10 s
        result = await tool.invoke({}, CTX)
    assert result.is_error and result.outcome == "timeout"


async def test_default_time_limit_applies_and_bad_limits_are_refused() -> None:
    from hango_worker.tool.registry import Registry, ToolLoadError
    from hango_worker.tool.types import DEFAULT_TOOL_TIMEOUT_S

    async def ok(args: dict[str, Any], ctx: ToolContext) -> str:
        return "ok"

    assert Tool("t", "d", OBJ, ok).limit_s == DEFAULT_TOOL_TIMEOUT_S == 60.0
    for bad in (0, -1, float("inf")):
        with pytest.raises(ToolLoadError, match="tool 't': timeout_s must be a positive"):
            Registry([Tool("t", "d", OBJ, ok, timeout_s=bad)])


# -- cancel --------------------------------------------------------------------------------


async def test_cancel_interrupts_a_running_tool_and_the_run_ends_cancelled(
    pool: asyncpg.Pool, dsn: str, spans: SpanReader
) -> None:
    started: list[str] = []

    async def cancel_then_hang(args: dict[str, Any], ctx: ToolContext) -> str:
        started.append(ctx.tool_use_id)
        await repo.request_cancel(pool, repo.DEFAULT_TENANT_ID, ctx.run_id)
        await asyncio.Event().wait()  # would hold the run `running` for its whole time limit
        return "never"

    hang = Tool("hang", "Cancels its run, then never returns.", OBJ, cancel_then_hang)
    # one call at a time, so the second call is still to start when the cancel comes
    # (side by side: tests/test_parallel_tools.py)
    await make_agent(pool, tools=["hang"], config={"max_parallel_tools": 1})
    run_id = await enqueue(pool)
    before = tool_calls("hang", "cancelled")
    script = [{"tool_calls": [call("hang"), call("hang")]}, {"text": "unreachable"}]
    async with asyncio.timeout(45):  # the tool's own limit is 60 s
        await run_until_idle(dsn, scripted(*script), [hang])
    run = await details(pool, run_id)
    assert run["status"] == "cancelled"
    assert len(started) == 1  # the second call never started
    first, second = results(run)
    assert first["is_error"] and first["content"].startswith(
        "interrupted: the run was cancelled while this tool was running"
    )
    assert second["is_error"] and second["content"] == (
        "not executed: the run was cancelled before this call started"
    )
    assert tool_calls("hang", "cancelled") == before + 1
    assert len(spans.events("tool.cancelled")) == 1


# -- sync tools ----------------------------------------------------------------------------


async def test_a_sync_tool_runs_in_a_thread_and_its_time_limit_holds(
    release: threading.Event,
) -> None:
    seen: list[int] = []
    loop_ran = threading.Event()

    def blocking(args: dict[str, Any], ctx: ToolContext) -> str:
        seen.append(threading.get_ident())
        if args.get("handshake"):  # answered by a coroutine: only if the loop is free
            return "loop ran" if loop_ran.wait(10) else "loop was blocked"
        if args.get("block"):
            release.wait(30)  # blocks its thread, never the event loop
        return f"done {args.get('n')}"

    async def on_the_loop() -> None:
        loop_ran.set()

    tool = Tool("blocking", "A sync tool.", OBJ, blocking, timeout_s=0.3)
    setter = asyncio.create_task(on_the_loop())  # runs once the loop is free
    assert (await tool.invoke({"handshake": True}, CTX)).content == "loop ran"
    await setter
    async with asyncio.timeout(10):
        blocked = await tool.invoke({"block": True}, CTX)
    assert blocked.is_error and blocked.outcome == "timeout"
    assert await tool.invoke({"n": 2}, CTX) == ToolResult("done 2")
    assert seen and threading.get_ident() not in seen


# -- unusable results ----------------------------------------------------------------------


async def test_results_that_are_not_text_are_converted_by_the_stated_rule() -> None:
    async def returns(args: dict[str, Any], ctx: ToolContext) -> Any:
        return {"dict": {"a": [1, 2.5, None]}, "list": [1, "é"], "none": None, "n": 7}[args["k"]]

    tool = Tool("returns", "Returns data.", OBJ, returns)
    got = {k: (await tool.invoke({"k": k}, CTX)).content for k in ("dict", "list", "none", "n")}
    assert got == {"dict": '{"a": [1, 2.5, null]}', "list": '[1, "é"]', "none": "null", "n": "7"}
    assert ToolResult({"x": 1}).content == '{"x": 1}'  # type: ignore[arg-type]


async def test_a_result_that_cannot_be_text_is_a_clear_error() -> None:
    async def returns_bytes(args: dict[str, Any], ctx: ToolContext) -> Any:
        return b"\x00\x01"

    async def bad_result(args: dict[str, Any], ctx: ToolContext) -> Any:
        return ToolResult(object())  # type: ignore[arg-type]

    before = tool_calls("raw", "bad_result")
    outcome, _, io = await run_agent(
        agent(tools=["raw", "bad"]),
        scripted({"tool_calls": [call("raw"), call("bad")]}, {"text": "ok"}),
        tools=[Tool("raw", "Bytes.", OBJ, returns_bytes), Tool("bad", "Bad.", OBJ, bad_result)],
    )
    assert outcome.status == "succeeded"
    raw, bad = results(io)
    assert raw["content"] == (
        "tool 'raw' returned an unusable result: a tool result must be str, ToolResult, "
        "JSON data, content blocks or the bytes of an image or PDF; got bytes that are not "
        "a PNG, JPEG, GIF, WebP or PDF (return (bytes, media_type) to name another)"
    )
    assert bad["content"].startswith("tool 'bad' failed: TypeError: a tool result must be")
    assert raw["is_error"] and bad["is_error"]
    assert tool_calls("raw", "bad_result") == before + 1


# -- the calculator ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("(((9**9)**99)**99)**99", "the result could be larger than the calculator's limit"),
        ("9**9**9", "the result could be larger than the calculator's limit"),
        ("(10**300)*(10**300)*(10**300)*(10**300)*(10**300)", "could be larger than"),
        ("round(5, -10**300)", "round() takes an integer number of digits up to 1000"),
    ],
)
async def test_the_calculator_refuses_work_that_would_block_the_event_loop(
    expression: str, message: str
) -> None:
    async with asyncio.timeout(5):  # unbounded, the first one computes for many seconds
        result = await CALCULATOR.invoke({"expression": expression}, CTX)
    assert result.is_error and message in result.content


async def test_the_calculator_still_computes_big_exact_answers() -> None:
    result = await CALCULATOR.invoke({"expression": "2**1000 + 7**300 % 13"}, CTX)
    assert not result.is_error and result.content == str(2**1000 + 7**300 % 13)
