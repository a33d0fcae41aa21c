"""Parallel tool calls (agent/batch.py, docs/design.md §5.5): the calls of one response
run side by side up to `max_parallel_tools`, each through the whole tool onion and
recorded as it completes; the model gets the results in call order; sequential tools
and calls that wait for a person run alone, in order; a cancel stops only what runs."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY

from hango_worker.agent.loop import RunInfo
from hango_worker.agent.middleware import SuspendRun, ToolCallRequest, ToolHandler
from hango_worker.agent.middlewares.repeat import RepeatCall, RepeatState, call_key
from hango_worker.agent.spec import AgentConfig, AgentSpec, AgentSpecError
from hango_worker.agent.state import dump_state
from hango_worker.provider.types import ToolResultBlock
from hango_worker.testing.inmem import MemoryRunIO, make_state, run_agent
from hango_worker.tool.types import Tool, ToolContext, ToolResult
from tests.helpers import agent, call, scripted

SCHEMA = {
    "type": "object",
    "properties": {"who": {"type": "string"}, "seconds": {"type": "number"}},
    "required": ["who"],
}


class Timeline:
    """What each tool call did, when (the test's own clock), in the order it happened."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.times: dict[str, tuple[float, float]] = {}

    def tool(self, name: str, *, sequential: bool = False, idempotent: bool = False) -> Tool:
        async def fn(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
            who = str(args["who"])
            started = time.monotonic()
            self.log.append(f"start {who}")
            try:
                await asyncio.sleep(float(args.get("seconds", 0.05)))
            finally:
                self.times[who] = (started, time.monotonic())
            self.log.append(f"end {who}")
            return ToolResult(f"{who} done")

        return Tool(name, "Sleeps.", SCHEMA, fn, idempotent=idempotent, sequential=sequential)

    def started(self) -> list[str]:
        return [e.split(" ", 1)[1] for e in self.log if e.startswith("start ")]


def results(state: Any) -> list[ToolResultBlock]:
    return [b for m in state.messages for b in m.content if isinstance(b, ToolResultBlock)]


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


THREE_SLOW = {
    "text": "Three lookups.",
    "tool_calls": [
        call("slow", who="a", seconds=1.0),
        call("slow", who="b", seconds=0.9),
        call("slow", who="c", seconds=0.8),
    ],
}


async def test_three_slow_calls_take_about_one_call_and_answer_in_call_order(spans: Any) -> None:
    t = Timeline()
    groups = sample("hango_tool_parallel_calls_count")
    started = time.monotonic()
    outcome, state, io = await run_agent(
        agent(tools=["slow"]), scripted(THREE_SLOW, {"text": "ok"}), tools=[t.tool("slow")]
    )
    took = time.monotonic() - started
    assert outcome.status == "succeeded"
    assert took < 2 * 1.0, took  # side by side: not 1.0 + 0.9 + 0.8
    # recorded as each completed (c first), given to the model in call order
    assert [e.payload["content"] for e in io.events if e.type == "tool_result"] == [
        "c done",
        "b done",
        "a done",
    ]
    assert [r.content for r in results(state)] == ["a done", "b done", "c done"]
    uses = state.messages[1].tool_uses()
    assert [r.tool_use_id for r in results(state)] == [u.id for u in uses]
    # spans: siblings under the turn, overlapping in time; the group is an event
    (turn,) = spans.named("turn 1")
    tools = spans.named("execute_tool slow")
    assert len(tools) == 3
    assert {s.parent.span_id for s in tools} == {turn.context.span_id}
    assert max(s.start_time for s in tools) < min(s.end_time for s in tools)
    (group,) = [e for e in turn.events if e.name == "tool.parallel_group"]
    assert dict(group.attributes or {}) == {
        "hango.tool.parallel.calls": 3,
        "hango.tool.parallel.limit": 8,
    }
    assert sample("hango_tool_parallel_calls_count") == groups + 1


async def test_max_parallel_tools_bounds_the_calls_running_at_once(spans: Any) -> None:
    t = Timeline()
    turn = {"tool_calls": [call("slow", who=n, seconds=0.3) for n in "abc"]}
    await run_agent(
        agent(tools=["slow"], max_parallel_tools=2),
        scripted(turn, {"text": "ok"}),
        tools=[t.tool("slow")],
    )
    # a and b start together; c only once one of them has finished
    assert t.log[:2] == ["start a", "start b"]
    assert t.log.index("start c") > min(t.log.index("end a"), t.log.index("end b"))
    (group,) = spans.events("tool.parallel_group")
    assert group.attributes["hango.tool.parallel.limit"] == 2
    # one at a time: the sequential loop of before, no group at all
    t1 = Timeline()
    spans.exporter.clear()
    await run_agent(
        agent(tools=["slow"], max_parallel_tools=1),
        scripted(turn, {"text": "ok"}),
        tools=[t1.tool("slow")],
    )
    assert t1.log == ["start a", "end a", "start b", "end b", "start c", "end c"]
    assert spans.events("tool.parallel_group") == []


async def test_a_sequential_tool_runs_alone_between_the_parallel_calls() -> None:
    t = Timeline()
    turn = {
        "tool_calls": [
            call("slow", who="a", seconds=0.2),
            call("slow", who="b", seconds=0.1),
            call("save", who="s", seconds=0.05),
            call("slow", who="c", seconds=0.1),
            call("slow", who="d", seconds=0.2),
        ]
    }
    outcome, state, _ = await run_agent(
        agent(tools=["slow", "save"]),
        scripted(turn, {"text": "ok"}),
        tools=[t.tool("slow"), t.tool("save", sequential=True)],
    )
    assert outcome.status == "succeeded"
    assert t.log == [
        "start a",
        "start b",
        "end b",
        "end a",
        "start s",  # after everything before it
        "end s",
        "start c",  # before anything after it
        "start d",
        "end c",
        "end d",
    ]
    assert [r.content for r in results(state)] == [f"{n} done" for n in "absdc"[:3] + "cd"]


async def test_write_todos_twice_in_one_response_is_still_an_error_for_both() -> None:
    t = Timeline()
    todos = [{"content": "x", "status": "pending"}]
    turn = {
        "tool_calls": [
            call("slow", who="a"),
            call("write_todos", todos=todos),
            call("write_todos", todos=todos),
            call("slow", who="b"),
        ]
    }
    outcome, state, _ = await run_agent(
        agent(tools=["slow", "write_todos"]), scripted(turn, {"text": "ok"}), tools=[t.tool("slow")]
    )
    assert outcome.status == "succeeded"
    a, w1, w2, b = results(state)
    assert (a.content, b.content) == ("a done", "b done")
    for w in (w1, w2):
        assert w.is_error and "write_todos was called 2 times in one response" in w.content
    assert state.todos == []


@pytest.mark.parametrize("limit", [8, 1])
async def test_identical_calls_in_one_batch_are_counted_as_in_the_sequential_loop(
    limit: int,
) -> None:
    t = Timeline()
    same = call("slow", who="same", seconds=0.05)
    turn = {"tool_calls": [same, call("slow", who="other", seconds=0.05), same, same, same]}
    outcome, state, _ = await run_agent(
        agent(tools=["slow"], max_parallel_tools=limit),
        scripted(turn, {"text": "ok"}),
        tools=[t.tool("slow")],
    )
    assert outcome.status == "succeeded"
    # threshold 3: the third and fourth identical calls are blocked, whatever the limit
    assert t.started() in (["same", "other", "same"], ["same", "same", "other"])
    assert sorted(t.started()) == ["other", "same", "same"]
    r = results(state)
    assert [x.is_error for x in r] == [False, False, False, True, True]
    assert "already made 2 times" in r[3].content and "already made 3 times" in r[4].content
    st = RepeatState.model_validate(state.private["repeat_call"])
    counts = dict(st.recent)
    assert counts[call_key("slow", same["input"])] == 4
    assert counts[call_key("slow", {"who": "other", "seconds": 0.05})] == 1


class SuspendsLater:
    """Suspends calls of `wait` after a moment (as an approval could, or a child run):
    meanwhile the other calls of the batch are counted by RepeatCall."""

    name = "suspends_later"

    async def wrap_tool_call(self, req: ToolCallRequest, next: ToolHandler) -> ToolResult:
        if req.call.name != "wait":
            return await next(req)
        await asyncio.sleep(0.1)
        raise SuspendRun("approval", {"tool_use_id": req.call.id})


async def test_a_suspended_call_takes_back_only_its_own_repeat_count() -> None:
    t = Timeline()
    turn = {"tool_calls": [call("wait", who="w"), call("slow", who="a", seconds=0.01)]}
    outcome, state, io = await run_agent(
        agent(tools=["wait", "slow"]),
        scripted(turn, {"text": "ok"}),
        tools=[t.tool("wait"), t.tool("slow")],
        stack=[RepeatCall(3), SuspendsLater()],
    )
    assert outcome.status == "waiting"
    assert outcome.waiting is not None and outcome.waiting["not_started"] == ["toolu_s0000_0"]
    assert list(io.tool_results) == ["toolu_s0000_1"]  # a ran and is recorded
    st = RepeatState.model_validate(state.private["repeat_call"])
    # a's count survives w's suspension (restoring a copy taken before w would lose it)
    assert dict(st.recent) == {call_key("slow", {"who": "a", "seconds": 0.01}): 1}


async def test_a_call_that_needs_approval_waits_for_the_calls_before_it_and_stops_the_rest() -> (
    None
):
    t = Timeline()
    turn = {
        "tool_calls": [
            call("slow", who="a", seconds=0.1),
            call("slow", who="b", seconds=0.1),
            call("deploy", who="d"),
            call("slow", who="c"),
        ]
    }
    outcome, _, io = await run_agent(
        agent(tools=["slow", "deploy"], approvals=[{"tool": "deploy"}]),
        scripted(turn, {"text": "ok"}),
        tools=[t.tool("slow"), t.tool("deploy")],
    )
    assert outcome.status == "waiting" and outcome.waiting is not None
    assert outcome.waiting["reason"] == "approval"
    assert outcome.waiting["not_started"] == ["toolu_s0000_2", "toolu_s0000_3"]
    assert t.log == ["start a", "start b", "end a", "end b"]  # together, then the wait
    assert sorted(io.tool_results) == ["toolu_s0000_0", "toolu_s0000_1"]


async def test_cancel_mid_batch_keeps_finished_results_and_interrupts_the_running_ones() -> None:
    t = Timeline()
    io = MemoryRunIO()
    turn = {
        "tool_calls": [
            call("slow", who="fast", seconds=0.01),
            call("slow", who="s1", seconds=30),
            call("slow", who="s2", seconds=30),
            call("slow", who="s3", seconds=30),  # waits for a free slot
            call("save", who="after"),  # after the group: never starts
        ]
    }

    async def cancel_when_both_run() -> None:
        while t.started() != ["fast", "s1", "s2"]:
            await asyncio.sleep(0.01)
        io.control.cancel.set()

    canceller = asyncio.ensure_future(cancel_when_both_run())
    started = time.monotonic()
    outcome, state, _ = await run_agent(
        agent(tools=["slow", "save"], max_parallel_tools=2),
        scripted(turn, {"text": "never"}),
        tools=[t.tool("slow"), t.tool("save", sequential=True)],
        io=io,
    )
    await canceller
    assert time.monotonic() - started < 10
    assert outcome.status == "cancelled"
    assert t.started() == ["fast", "s1", "s2"]  # nothing started after the cancel
    r = results(state)
    assert r[0].content == "fast done" and not r[0].is_error
    for x in r[1:3]:
        assert x.is_error and x.content.startswith("interrupted: the run was cancelled")
    for x in r[3:]:
        assert x.is_error
        assert x.content == "not executed: the run was cancelled before this call started"
    assert sorted(io.tool_results) == [f"toolu_s0000_{i}" for i in range(5)]  # all recorded
    assert [io.tool_results[f"toolu_s0000_{i}"].outcome for i in range(5)] == [None] + [
        "cancelled"
    ] * 4


async def test_the_attempt_cancelled_mid_batch_leaves_no_call_running() -> None:
    t = Timeline()
    turn = {
        "tool_calls": [
            call("slow", who="fast", seconds=0.01),
            call("slow", who="s1", seconds=30),
            call("slow", who="s2", seconds=30),
        ]
    }
    io = MemoryRunIO()
    attempt = asyncio.ensure_future(
        run_agent(
            agent(tools=["slow"]), scripted(turn, {"text": "x"}), tools=[t.tool("slow")], io=io
        )
    )
    while "toolu_s0000_0" not in io.tool_results or len(t.started()) < 3:
        await asyncio.sleep(0.01)
    attempt.cancel()  # what a hard stop does to the attempt's task
    with pytest.raises(asyncio.CancelledError):
        await attempt
    assert list(io.tool_results) == ["toolu_s0000_0"]  # the finished one is recorded
    assert set(t.times) == {"fast", "s1", "s2"}  # and the running ones have stopped
    assert all(end - start < 10 for start, end in t.times.values())


def test_max_parallel_tools_is_validated_with_a_clear_error() -> None:
    assert AgentConfig(max_parallel_tools=1).max_parallel_tools == 1
    row = {"id": "1", "name": "bad", "model": "m", "config": {"max_parallel_tools": 0}}
    with pytest.raises(AgentSpecError, match="max_parallel_tools") as e:
        AgentSpec.from_row(row)
    assert "greater than or equal to 1" in str(e.value)
    row["config"] = {"max_parallel_tools": "many"}
    with pytest.raises(AgentSpecError, match="max_parallel_tools"):
        AgentSpec.from_row(row)


def test_tools_that_change_run_state_are_sequential_and_readers_are_not() -> None:
    from hango_worker.agent.middlewares.filesystem import Filesystem
    from hango_worker.agent.middlewares.subagent import Subagent
    from hango_worker.agent.middlewares.todo import Todo
    from hango_worker.testing.inmem import make_state
    from hango_worker.tool.registry import Registry

    state = make_state(agent())
    fs = {t.name: t.sequential for t in Filesystem(None).provide_tools(state)}
    assert fs == {
        "ls": False,
        "read_file": False,
        "grep": False,
        "write_file": True,
        "edit_file": True,
    }
    assert [t.sequential for t in Todo().provide_tools(state)] == [True]
    assert [t.sequential for t in Subagent(None).provide_tools(state)] == [True]
    builtins = Registry.default(load_entry_points=False).view(["current_time", "calculator"])
    assert [t.sequential for t in builtins] == [False, False]


@pytest.mark.parametrize("limit", [8, 1])
async def test_tool_call_limits_refuse_the_same_calls_as_the_sequential_loop(limit: int) -> None:
    t = Timeline()
    turn = {"tool_calls": [call("slow", who=n, seconds=0.05) for n in "abcd"]}
    outcome, state, _ = await run_agent(
        agent(tools=["slow"], max_tool_calls=2, max_parallel_tools=limit),
        scripted(turn, {"text": "ok"}),
        tools=[t.tool("slow")],
    )
    assert outcome.limit == "max_tool_calls"
    assert sorted(t.started()) == ["a", "b"]
    assert [r.is_error for r in results(state)] == [False, False, True, True]
    assert state.private["limits"]["total"] == 2


class SnapshotIO(MemoryRunIO):
    """Keeps `state_json` as each tool result stored it: what Postgres holds after a
    kill -9 right after that result."""

    def __init__(self) -> None:
        super().__init__()
        self.snapshots: list[dict[str, Any]] = []

    async def record_tool_result(self, state: Any, call: Any, result: Any, event: Any) -> None:
        await super().record_tool_result(state, call, result, event)
        self.snapshots.append(copy.deepcopy(dump_state(state)))


async def test_calls_rerun_after_a_crash_are_counted_once_for_repeats_and_limits() -> None:
    t = Timeline()
    same = call("slow", who="same", seconds=0.2)
    turn = {"tool_calls": [call("slow", who="a", seconds=0.01), same, same]}
    a = agent(tools=["slow"], max_tool_calls=10)
    io = SnapshotIO()
    tool = t.tool("slow", idempotent=True)
    _, state, _ = await run_agent(a, scripted(turn, {"text": "ok"}), tools=[tool], io=io)
    whole = state.private
    # the crash: only a's result is stored, with the counts of the two calls beside it
    crashed = io.snapshots[0]
    assert crashed["private"]["limits"]["total"] == 3
    history = state.messages[:2]
    again = make_state(a, text=None, history=history)
    again.private = copy.deepcopy(crashed["private"])
    first = next(iter(io.tool_results))
    t.log.clear()
    outcome, state, _ = await run_agent(
        a,
        scripted({}, {"text": "ok"}),
        tools=[tool],
        state=again,
        info=RunInfo(persisted=2, turns_done=1, recorded={first: io.tool_results[first]}),
    )
    assert outcome.status == "succeeded"
    assert t.started() == ["same", "same"]  # only the unfinished ones ran again
    r = results(state)
    assert [x.content for x in r] == ["a done", "same done", "same done"]  # none blocked
    # the same counts as the run that never crashed
    assert state.private["limits"]["total"] == whole["limits"]["total"] == 3
    assert state.private["repeat_call"]["recent"] == whole["repeat_call"]["recent"]


async def test_a_shutdown_mid_batch_lets_the_calls_finish_and_hands_the_run_back() -> None:
    t = Timeline()
    io = MemoryRunIO()
    turn = {"tool_calls": [call("slow", who=n, seconds=0.2) for n in "abc"]}

    async def shutdown_when_all_run() -> None:
        while len(t.started()) < 3:
            await asyncio.sleep(0.01)
        io.control.shutdown = True

    stopper = asyncio.ensure_future(shutdown_when_all_run())
    outcome, state, _ = await run_agent(
        agent(tools=["slow"]), scripted(turn, {"text": "never"}), tools=[t.tool("slow")], io=io
    )
    await stopper
    assert outcome.status == "released"  # at the turn boundary, after the batch
    assert [r.content for r in results(state)] == ["a done", "b done", "c done"]
    assert sorted(io.tool_results) == [f"toolu_s0000_{i}" for i in range(3)]


async def test_a_repeated_call_id_runs_once_and_the_repeat_gets_an_error_in_its_place() -> None:
    t = Timeline()
    turn = {
        "tool_calls": [
            {"name": "slow", "input": {"who": "a"}, "id": "toolu_same"},
            call("slow", who="b"),
            {"name": "slow", "input": {"who": "c"}, "id": "toolu_same"},
        ]
    }
    outcome, state, _ = await run_agent(
        agent(tools=["slow"]), scripted(turn, {"text": "ok"}), tools=[t.tool("slow")]
    )
    assert outcome.status == "succeeded"
    assert sorted(t.started()) == ["a", "b"]  # the repeat never ran
    got = results(state)
    assert [b.tool_use_id for b in got] == ["toolu_same", "toolu_s0000_1", "toolu_same"]
    assert [b.is_error for b in got] == [False, False, True]
    assert "'toolu_same' appears more than once in this response" in got[2].content
