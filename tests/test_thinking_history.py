"""Interleaved thinking stays with its tool_use (docs/system-architecture.md, "Content
blocks"): through compaction (tool results cleared, turns dropped, a summary call),
an `ask_user` wait (the next attempt rebuilds the history from Postgres) and a fork.

A real worker, the real SDK and the fake server with thinking on: the fake refuses any
request whose tool loop in progress does not start with its thinking, and any
assistant message sent back changed (testing/fake_anthropic/roundtrip.py)."""

from __future__ import annotations

from typing import Any

import asyncpg

from hango_worker.agent.compaction import SUMMARY_SYSTEM
from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.store import decisions, fork, repo
from hango_worker.testing.fake_anthropic import FakeAnthropic, RecordedRequest
from hango_worker.vocab import Decision
from tests.helpers import call, recording_tool
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle

T = repo.DEFAULT_TENANT_ID
CONFIG = {
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "max_tokens": 2048,
    "context_window": 8000,
    "compact_trigger": 0.5,
    "compact_target": 0.1,
    "keep_tool_results": 3,
}
TOOL_TURNS = 6


def model() -> tuple[Any, list[RecordedRequest]]:
    """Six echo turns (each thinking first), an ask_user turn, then answers; a summary
    request (its own system prompt) gets a summary."""
    calls: list[RecordedRequest] = []

    def answer(rec: RecordedRequest) -> dict[str, Any]:
        system = rec.body.get("system") or []
        if any(SUMMARY_SYSTEM[:40] in str(b.get("text", "")) for b in system):
            return {"text": "Summary: the user asked for echoes."}
        calls.append(rec)
        n = len(calls)
        # ids and signatures of their own: compaction changes the turn index the fake
        # would number them by
        if n <= TOOL_TURNS:
            use = {**call("echo", text=f"{n} " + "y" * 1500), "id": f"toolu_n{n}"}
            return {"blocks": [thought(f"step {n}: echo some more", n)], "tool_calls": [use]}
        if n == TOOL_TURNS + 1:
            use = {**call("ask_user", question="Go on?"), "id": f"toolu_n{n}"}
            return {"blocks": [thought("ask first", n)], "tool_calls": [use]}
        return {"text": f"done after {n} calls"}

    return answer, calls


def thought(text: str, n: int) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": f"sig-{n}"}


def thinking_stays_first(body: dict[str, Any]) -> None:
    """Every assistant message with a tool_use starts with its thinking, as produced."""
    for m in body["messages"]:
        kinds = [b["type"] for b in m["content"]] if isinstance(m["content"], list) else []
        if m["role"] == "assistant" and "tool_use" in kinds:
            first = m["content"][0]
            assert first["type"] == "thinking", kinds
            assert first["signature"].startswith("sig-") and first["thinking"]


async def test_thinking_stays_with_its_tool_use_through_compaction_a_wait_and_a_fork(
    pool: asyncpg.Pool, dsn: str
) -> None:
    echo, _ = recording_tool()
    await make_agent(pool, tools=["echo", "ask_user"], config=CONFIG)
    run_id = await enqueue(pool)
    handler, calls = model()
    async with FakeAnthropic(handler=handler) as fake:
        provider = AnthropicProvider(api_key="test", base_url=fake.base_url, max_retries=0)
        try:
            await run_until_idle(dsn, provider, [echo])
            run = await details(pool, run_id)
            assert run["status"] == "waiting", run["error"]
            await decisions.decide(pool, T, run_id, Decision.ANSWER, text="yes")
            await run_until_idle(dsn, provider, [echo])  # history rebuilt from Postgres
            run = await details(pool, run_id)
            assert run["status"] == "succeeded", run["error"]
            # compaction happened: a summary call, and later requests hold fewer
            # messages than the history
            summaries = [r for r in fake.requests if r not in calls]
            assert summaries, "no summary call: compaction never reached its last rung"
            history = len(run["transcript"])
            assert len(calls[-1].messages) < history - 1
            for rec in calls:
                thinking_stays_first(rec.body)
            # the resumed request sends the ask_user turn back with its thinking first
            resumed = calls[TOOL_TURNS + 1].body["messages"]
            assert resumed[-2]["content"][0] == thought("ask first", TOOL_TURNS + 1)
            # a fork from turn 3 (a tool turn): its first request keeps that turn's
            # thinking before its tool_use
            forked = await fork.fork(pool, T, run_id, 3)
            await run_until_idle(dsn, provider, [echo])
            child = await details(pool, forked["run_id"])
            assert child["status"] == "succeeded", child["error"]
            first = calls[TOOL_TURNS + 2].body
            thinking_stays_first(first)
            assert first["thinking"]["type"] == "enabled"  # the fake checks the tool loop
            assert first["messages"][-2]["content"][0]["thinking"] == "step 3: echo some more"
        finally:
            await provider.aclose()
