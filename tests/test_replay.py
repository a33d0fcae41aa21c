"""`hango-worker replay`: a run recorded by the worker on Postgres (against the fake
Messages API), driven again by the current code with the recorded responses and tool
results. Identical with no model request, no tool executed and nothing written; a
changed system prompt, a changed middleware and a changed tool result each diverge at
the right request and field."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from hango_worker.agent.middlewares import todo
from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.run.execute import assembly_settings
from hango_worker.run.replay import ReplayError, ReplayReport, replay
from hango_worker.store import decisions, fork, repo
from hango_worker.testing.fake_anthropic import FakeAnthropic
from hango_worker.tool.registry import Registry
from hango_worker.tool.types import Tool, ToolContext, ToolResult
from hango_worker.vocab import Decision
from tests.helpers import call, recording_tool, scripted
from tests.test_cli import cli
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle, settings

T = repo.DEFAULT_TENANT_ID
PLAN = [{"content": "search", "status": "in_progress"}, {"content": "echo", "status": "pending"}]
SEARCH = [
    {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search", "input": {"q": "x"}},
    {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_01",
        "content": [{"type": "web_search_result", "url": "https://e.com", "title": "E"}],
    },
]
CITED = {
    "type": "text",
    "text": "The answer is 42.",
    "citations": [{"type": "web_search_result_location", "url": "https://e.com", "title": "E"}],
}


def turns(tool: str = "echo") -> list[dict[str, Any]]:
    echo = [call(tool, text="hi")] if tool == "echo" else []
    return [
        {
            "thinking": "Plan first.",
            "blocks": SEARCH,
            "tool_calls": [call("write_todos", todos=PLAN)],
        },
        {"text": "Working.", "tool_calls": [*echo, call("calculator", expression="6*7")]},
        {"blocks": [CITED]},
    ]


async def record(pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, tools: list[str]) -> str:
    """A run of three model calls with tools, recorded by the worker."""
    await make_agent(pool, tools=tools)
    run_id = await enqueue(pool, "find the answer")
    echo, _ = recording_tool()
    claude = AnthropicProvider(api_key="test-key", base_url=fake.base_url, max_retries=0)
    try:
        await run_until_idle(dsn, claude, [echo])
    finally:
        await claude.aclose()
    run = await details(pool, run_id)
    assert run["status"] == "succeeded", run["error"]
    assert len(fake.requests) == 3
    return run_id


@pytest.fixture
async def fake() -> AsyncIterator[FakeAnthropic]:
    with FakeAnthropic(turns()) as f:
        yield f


@pytest.fixture
async def recorded(pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic) -> str:
    return await record(pool, dsn, fake, ["echo", "calculator", "write_todos"])


async def snapshot(pool: asyncpg.Pool) -> list[Any]:
    """Every row a replay could write, counted, and the runs as they are."""
    tables = ("runs", "messages", "run_events", "tool_calls", "run_states", "run_files")
    counts = [await pool.fetchval(f"SELECT count(*) FROM {t}") for t in tables]
    runs = await pool.fetch("SELECT row_to_json(r)::text FROM runs r ORDER BY id")
    return [counts, [r[0] for r in runs]]


async def do_replay(
    pool: asyncpg.Pool, dsn: str, run_id: str, echo: Tool | None = None, **kw: Any
) -> ReplayReport:
    tool = echo or recording_tool()[0]
    registry = Registry([*Registry.default(load_entry_points=False).view(["calculator"]), tool])
    return await replay(
        pool, T, run_id, registry=registry, settings=assembly_settings(settings(dsn)), **kw
    )


async def test_a_recorded_run_replays_identical_without_a_model_call_or_a_write(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, recorded: str
) -> None:
    before = await snapshot(pool)
    echo, executed = recording_tool()
    report = await do_replay(pool, dsn, recorded, echo)
    assert report.identical, report.divergence
    assert (report.requests, report.recorded, report.basis) == (3, 3, "recorded")
    assert report.to_dict()["result"] == "identical"
    assert len(fake.requests) == 3, "a replay reached the model endpoint"
    assert executed == [], "a tool ran instead of its recorded result"
    assert await snapshot(pool) == before


async def test_a_changed_system_prompt_diverges_at_request_1_naming_system(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, recorded: str
) -> None:
    before = await snapshot(pool)
    report = await do_replay(pool, dsn, recorded, config={"system": ["Be terse."]})
    d = report.divergence
    assert d is not None and (d.request, d.field) == (1, "system")
    assert "-Be brief." in d.diff and "+Be terse." in d.diff, d.diff
    assert d.note == ""  # the recorded system rebuilt exactly (the run's own agent)
    # another agent of the tenant, by name: the same divergence
    await make_agent(pool, name="terse", tools=["echo", "calculator", "write_todos"])
    await pool.execute("UPDATE agents SET system = '[\"Be terse.\"]' WHERE name = 'terse'")
    other = await do_replay(pool, dsn, recorded, agent="terse")
    assert other.divergence is not None and other.divergence.field == "system"
    assert other.divergence.request == 1 and "+Be terse." in other.divergence.diff
    assert len(fake.requests) == 3 and await snapshot(pool) == before


async def test_a_changed_middleware_diverges_at_the_request_it_changes(
    pool: asyncpg.Pool, dsn: str, recorded: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan (written by request 1's tool call) is in request 2's system prompt: a
    code change to how the todo middleware renders it shows there, not before."""
    real = todo.render
    monkeypatch.setattr(todo, "render", lambda todos: real(todos).replace("[~]", "(doing)"))
    report = await do_replay(pool, dsn, recorded)
    d = report.divergence
    assert d is not None and (d.request, d.field) == (2, "system"), d
    assert "(doing) search" in d.diff and "other code" in d.note


async def test_a_changed_tool_result_diverges_at_the_next_request_in_its_message(
    pool: asyncpg.Pool, dsn: str, recorded: str
) -> None:
    async def shout(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult(f"ECHO: {args['text']}")

    schema = recording_tool()[0].input_schema
    echo = Tool("echo", recording_tool()[0].description, schema, shout)
    report = await do_replay(pool, dsn, recorded, echo, live_tools=True)
    d = report.divergence
    assert d is not None and (d.request, d.field) == (3, "messages"), d
    assert d.diff.startswith("message 5 ")
    assert '-      "content": "echo: hi"' in d.diff and '+      "content": "ECHO: hi"' in d.diff


async def test_a_run_recorded_without_fingerprints_is_compared_with_its_rebuilt_requests(
    pool: asyncpg.Pool, dsn: str, recorded: str
) -> None:
    await pool.execute(
        "UPDATE run_events SET payload = payload - 'request' WHERE type = 'model_message'"
    )
    same = await do_replay(pool, dsn, recorded)
    assert same.identical and same.basis == "rebuilt" and "no request fingerprints" in same.note
    changed = await do_replay(pool, dsn, recorded, config={"config": {"max_tokens": 1000}})
    d = changed.divergence
    assert d is not None and (d.request, d.field) == (1, "params")
    assert '+  "max_tokens": 1000,' in d.diff, d.diff


async def test_a_replay_that_makes_fewer_model_calls_diverges_at_the_missing_one(
    pool: asyncpg.Pool, dsn: str, recorded: str
) -> None:
    limited = {"config": {"max_turns": 1, "on_limit": "fail"}}
    report = await do_replay(pool, dsn, recorded, config=limited)
    d = report.divergence
    assert d is not None and (d.request, d.field) == (2, "calls"), d
    assert "made 1 requests" in d.note and "max_turns" in d.note and "made 3" in d.note


async def test_a_run_that_waited_is_compared_up_to_its_wait(pool: asyncpg.Pool, dsn: str) -> None:
    await make_agent(pool, name="asker", tools=["ask_user"])
    run_id = await enqueue(pool, "deploy it", agent="asker")
    script = [{"tool_calls": [call("ask_user", question="Which region?")]}, {"text": "Done."}]
    await run_until_idle(dsn, scripted(*script))
    assert (await details(pool, run_id))["status"] == "waiting"
    await decisions.decide(pool, T, run_id, Decision.ANSWER, text="eu-west-1")
    await run_until_idle(dsn, scripted(*script))
    assert (await details(pool, run_id))["status"] == "succeeded"
    report = await do_replay(pool, dsn, run_id)
    assert report.identical and (report.requests, report.recorded) == (1, 2)
    assert "both waited after request 1" in report.note


async def test_a_fork_replays_from_its_copied_history_and_state(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, recorded: str
) -> None:
    """A fork of turn 1 starts from the source's history and plan (state) at that turn."""
    ids = await fork.fork(pool, T, recorded, 1, "Go on.")
    echo, _ = recording_tool()
    claude = AnthropicProvider(api_key="test-key", base_url=fake.base_url, max_retries=0)
    try:
        await run_until_idle(dsn, claude, [echo])
    finally:
        await claude.aclose()
    assert (await details(pool, ids["run_id"]))["status"] == "succeeded"
    report = await do_replay(pool, dsn, ids["run_id"])
    assert report.identical, report.divergence
    assert (report.requests, report.recorded) == (2, 2)
    changed = await do_replay(pool, dsn, ids["run_id"], config={"system": ["Be terse."]})
    assert changed.divergence is not None and changed.divergence.request == 1
    assert "Current todo list" in changed.divergence.diff  # the copied plan, on both sides


async def test_what_cannot_be_replayed_says_why(
    pool: asyncpg.Pool, dsn: str, recorded: str
) -> None:
    with pytest.raises(ReplayError, match="unknown field"):
        await do_replay(pool, dsn, recorded, config={"prompt": "x"})
    with pytest.raises(repo.NotFound):
        await do_replay(pool, dsn, "00000000-0000-0000-0000-000000000000")
    queued = await enqueue(pool, "not yet")
    with pytest.raises(ReplayError, match="never started"):
        await do_replay(pool, dsn, queued)


async def test_the_command_exits_0_identical_1_diverged_2_error(
    pool: asyncpg.Pool, dsn: str
) -> None:
    """The CLI, in its own process, with the worker's registry (no test tool)."""
    with FakeAnthropic(turns(tool="calculator")) as fake:
        run_id = await record(pool, dsn, fake, ["calculator", "write_todos"])
        env = {"HANGO_MODEL_PROVIDER": "anthropic", "ANTHROPIC_BASE_URL": fake.base_url}
        env["ANTHROPIC_API_KEY"] = "test-key"
        same = cli(dsn, "replay", run_id, env=env)
        assert same.stdout.strip() == "identical (3 requests)"
        changed = cli(
            dsn, "replay", run_id, "--config", '{"system": ["Be terse."]}', env=env, ok=False
        )
        assert changed.returncode == 1, changed.stderr
        assert changed.stdout.startswith("diverged at request 1: system\n")
        as_json = cli(dsn, "replay", run_id, "--agent", "agent", "--json", env=env)
        assert json.loads(as_json.stdout)["result"] == "identical"
        missing = cli(dsn, "replay", "00000000-0000-0000-0000-000000000000", ok=False)
        assert missing.returncode == 2 and "no run" in missing.stderr
        assert len(fake.requests) == 3, "a replay reached the model endpoint"
