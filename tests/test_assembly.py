"""One assembly (agent/assemble.py): the same scripted agent run by a real worker
against Postgres and by the in-memory harness (testing/inmem.py `run_agent`) gives the
same transcript, outcome, events and model requests, so a test that passes in memory
describes what production does."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest

from hango_worker.agent.assemble import AssemblySettings
from hango_worker.agent.limits import RunOverrides, parse_overrides
from hango_worker.agent.spec import AgentConfig, AgentSpec
from hango_worker.agent.state import State
from hango_worker.provider.scripted import ScriptedProvider
from hango_worker.provider.types import Message, Request, Response, TextBlock, TextSink
from hango_worker.run.execute import assembly_settings
from hango_worker.store import repo
from hango_worker.testing.inmem import run_agent
from tests.helpers import call, recording_tool
from tests.worker_helpers import details, make_agent, run_until_idle, settings

SYSTEM = ["Be brief."]  # as tests/worker_helpers.py make_agent


class Recording(ScriptedProvider):
    """The scripted model, keeping what each request asked for (not the history)."""

    def __init__(self, turns: list[dict[str, Any]]) -> None:
        super().__init__(turns)
        self.seen: list[dict[str, Any]] = []

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        self.seen.append(
            {
                "system": [b.text for b in request.system],
                "tools": [t.name for t in request.tools],
                "tool_choice": request.tool_choice,
                "max_tokens": request.max_tokens,
                "temperature": request.temperature,
                "params": request.params,
                "messages": len(request.messages),
            }
        )
        return await super().complete(request, on_text)


def _looping(n: int) -> list[dict[str, Any]]:
    return [{"text": f"step {i}", "tool_calls": [call("echo", text=f"{i}")]} for i in range(n)]


@dataclass(frozen=True)
class Case:
    script: list[dict[str, Any]]
    ends: tuple[str, str | None]  # the run's status and limit_reached
    config: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, Any] | None = None  # runs.input.limits
    params: dict[str, Any] | None = None  # runs.input.params


ANSWERED = ("succeeded", None)
CASES = {
    "a tool call, then the answer": Case(
        [{"text": "let me see", "tool_calls": [call("echo", text="hi")]}, {"text": "done"}],
        ANSWERED,
    ),
    # the old harness ignored the agent's max_turns: it ran on to its own default
    "config max_turns with on_limit fail": Case(
        _looping(6), ("failed", "max_turns"), {"max_turns": 2, "on_limit": "fail"}
    ),
    "config max_turns, then the answer": Case(
        _looping(6), ("succeeded", "max_turns"), {"max_turns": 2}
    ),
    "the run's limits over the config": Case(
        _looping(6),
        ("failed", "max_turns"),
        {"max_turns": 4, "on_limit": "fail"},
        limits={"max_turns": 1},
    ),
    "a tool call limit": Case(_looping(6), ("succeeded", "max_tool_calls"), {"max_tool_calls": 2}),
    # the old harness sent neither the run's params nor the tenant as metadata.user_id
    "the run's params over the config": Case(
        [{"text": "ok"}],
        ANSWERED,
        {"temperature": 0.5, "max_tokens": 1000},
        params={"stop_sequences": ["STOP"], "metadata": {"user_id": "caller-7"}},
    ),
    # the old harness stopped at 20 turns; the worker's default is 50
    "the worker's default max_turns": Case(_looping(52), ("succeeded", "max_turns")),
}


def _transcript_of_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"role": r["role"], "content": r["content"]} for r in rows]


async def _production(pool: asyncpg.Pool, dsn: str, case: Case) -> dict[str, Any]:
    tool, _ = recording_tool()
    await make_agent(pool, name="same", tools=["echo"], config=case.config)
    enqueued = await repo.enqueue_run(
        pool,
        tenant_id=repo.DEFAULT_TENANT_ID,
        agent="same",
        input_text="go",
        limits=parse_overrides(case.limits) if case.limits else None,
        params=case.params,
    )
    provider = Recording(case.script)
    await run_until_idle(dsn, provider, tools=[tool])
    run = await details(pool, enqueued.run_id)
    return {
        "transcript": _transcript_of_rows(run["transcript"]),
        "status": run["status"],
        "limit_reached": run["limit_reached"],
        "error": run["error"],
        "events": [e["type"] for e in run["events"]],
        "requests": provider.seen,
    }


async def _in_memory(case: Case) -> dict[str, Any]:
    tool, _ = recording_tool()
    agent = AgentSpec(
        id="agent-same",
        name="same",
        model="claude-test",
        system=SYSTEM,
        tools=["echo"],
        config=AgentConfig.model_validate(case.config),
    )
    state = State(
        run_id="run-same",
        session_id="session-same",
        agent_id=agent.id,
        tenant_id=repo.DEFAULT_TENANT_ID,
        messages=[Message("user", [TextBlock("go")])],
    )
    provider = Recording(case.script)
    extra: dict[str, Any] = {}
    if case.limits is not None:
        extra["limits"] = RunOverrides.model_validate(case.limits)
    if case.params is not None:
        extra["params"] = case.params
    outcome, _, io = await run_agent(agent, provider, tools=[tool], state=state, **extra)
    return {
        "transcript": [m.to_dict() for m in io.messages],
        "status": outcome.status,
        "limit_reached": outcome.limit,
        "error": outcome.error,
        "events": [e.type for e in io.events],
        "requests": provider.seen,
    }


@pytest.mark.parametrize("name", sorted(CASES))
async def test_the_worker_and_the_harness_run_an_agent_the_same_way(
    pool: asyncpg.Pool, dsn: str, name: str
) -> None:
    case = CASES[name]
    production = await _production(pool, dsn, case)
    in_memory = await _in_memory(case)
    assert (production["status"], production["limit_reached"]) == case.ends
    for key in ("status", "limit_reached", "error", "transcript", "events", "requests"):
        assert in_memory[key] == production[key], key


def test_the_harness_defaults_are_the_worker_defaults(dsn: str) -> None:
    worker = assembly_settings(settings(dsn))
    harness = AssemblySettings()
    assert (worker.max_turns, worker.repeat_call_threshold, worker.capture_content) == (
        harness.max_turns,
        harness.repeat_call_threshold,
        harness.capture_content,
    )
    assert worker.prices.prices == harness.prices.prices
