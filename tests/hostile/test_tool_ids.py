"""A tool_use id the model reuses (one an earlier turn of the history already used, e.g.
a response replayed after a resume): the call is never executed, the model gets one
clear error result, and the history stays one result per call (agent/batch.py)."""

from __future__ import annotations

from typing import Any

from hango_worker.provider.types import Message, TextBlock, ToolResultBlock, ToolUseBlock
from hango_worker.testing.inmem import make_state, run_agent
from tests.helpers import agent, recording_tool, scripted


def use(text: str, tool_use_id: str = "toolu_same") -> dict[str, Any]:
    return {"tool_calls": [{"id": tool_use_id, "name": "echo", "input": {"text": text}}]}


async def test_an_id_from_before_a_resume_is_not_executed_again(spans: Any) -> None:
    """Proves: a history (from an earlier attempt) holds toolu_same with its result; the
    model returns toolu_same again: the tool does not run, the model is told why, a
    `tool.id_reused` event names the id; a fresh id in the same run still runs."""
    tool, calls = recording_tool()
    spec = agent(tools=["echo"])
    history = [
        Message("user", [TextBlock("hello")]),
        Message("assistant", [ToolUseBlock("toolu_same", "echo", {"text": "before"})]),
        Message("user", [ToolResultBlock("toolu_same", "echo: before")]),
    ]
    state = make_state(spec, text=None, history=history)
    # the script goes on from the history's turns: its first turn is the one already made
    provider = scripted(use("before"), use("again"), use("fresh", "toolu_new"), {"text": "done"})
    outcome, state, _ = await run_agent(spec, provider, tools=[tool], state=state)
    assert outcome.status == "succeeded"
    assert calls == [{"text": "fresh"}], "the reused id ran"
    refused = state.messages[4].content[0]
    assert isinstance(refused, ToolResultBlock) and refused.is_error
    assert "toolu_same" in str(refused.content) and "already used" in str(refused.content)
    assert "\n" not in str(refused.content)
    for i, m in enumerate(state.messages):  # every call answered once, right after it
        if m.role == "assistant" and m.tool_uses():
            answered = [b.tool_use_id for b in state.messages[i + 1].content
                        if isinstance(b, ToolResultBlock)]  # fmt: skip
            assert answered == [u.id for u in m.tool_uses()]
    (event,) = spans.events("tool.id_reused")
    assert event.attributes["hango.tool.use_id"] == "toolu_same"


async def test_an_id_reused_within_the_run_is_refused_each_time() -> None:
    """Proves: within one attempt, a later turn reusing an id is refused too (before:
    executed as a new call, whose record replaced the earlier one's)."""
    tool, calls = recording_tool()
    spec = agent(tools=["echo"])
    provider = scripted(use("one"), use("two"), use("three"), {"text": "done"})
    outcome, state, _ = await run_agent(spec, provider, tools=[tool])
    assert outcome.status == "succeeded" and calls == [{"text": "one"}]
    errors = [
        b for m in state.messages for b in m.content
        if isinstance(b, ToolResultBlock) and b.is_error
    ]  # fmt: skip
    assert len(errors) == 2
