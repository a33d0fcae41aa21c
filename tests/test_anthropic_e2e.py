"""End to end through the WORKER: Postgres queue → worker → AnthropicProvider → the real
`anthropic` SDK → FakeAnthropic on 127.0.0.1.

The provider is chosen the way an operator chooses it (HANGO_MODEL_PROVIDER=anthropic,
ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL → `make_provider`), and every transcript is
compared with what the scripted model produces for the same script. Nothing here
leaves the machine.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from hango_worker import demo
from hango_worker.agent.middlewares.repair import INTERRUPTED
from hango_worker.config import Settings
from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.provider.scripted import ScriptedProvider, load_script
from hango_worker.provider.types import Provider
from hango_worker.run.providers import DEMO_SCRIPT, make_provider
from hango_worker.service import serve
from hango_worker.testing import FakeAnthropic
from hango_worker.tool.registry import Registry
from hango_worker.tool.types import Tool
from tests.helpers import call, recording_tool
from tests.worker_helpers import details, enqueue, make_agent, settings

DEMO_KEY = "test-key"
SECRET = "sk-ant-e2e-0123456789-SECRET"  # distinctive, so "nowhere in the database" means it
LOOPBACK = ("127.0.0.1", "localhost", "::1")  # conftest also refuses a non-loopback base URL
ISO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[+-]\d{2}:\d{2}|Z)?")


# -- fixtures / helpers ----------------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    """A fake (in its own thread) whose script each test sets with `fake.load(...)`."""
    with FakeAnthropic([{"text": "unused"}]) as server:
        yield server


def use_anthropic(mp: pytest.MonkeyPatch, fake: FakeAnthropic, key: str = SECRET) -> None:
    """Configure the worker for Claude the way an operator does, pointed at the fake."""
    assert urlsplit(fake.base_url).hostname in LOOPBACK
    mp.setenv("HANGO_MODEL_PROVIDER", "anthropic")
    mp.setenv("ANTHROPIC_API_KEY", key)
    mp.setenv("ANTHROPIC_BASE_URL", fake.base_url)


@pytest.fixture
async def echo(pool: asyncpg.Pool) -> AsyncIterator[tuple[Tool, list[dict[str, Any]]]]:
    """A non-idempotent recording tool, and an agent allowed to call it and the calculator."""
    await make_agent(pool, tools=["echo", "calculator"])
    yield recording_tool()


def registry(*tools: Tool) -> Registry:
    reg = Registry.default(load_entry_points=False)
    for tool in tools:
        reg.add(tool)
    return reg


async def work(
    dsn: str, provider: Provider | None = None, tools: tuple[Tool, ...] = (), **over: Any
) -> Settings:
    """Run the worker until the queue is empty. Without `provider`, the worker picks it
    from the environment (`make_provider`), exactly as `hango-worker run` does."""
    s = settings(dsn, **over)
    built = provider or make_provider(s)
    try:
        await serve(s, dsn, until_idle=True, provider=built, registry=registry(*tools), logs=False)
    finally:
        if isinstance(built, AnthropicProvider) and provider is None:
            await built.aclose()
    return s


def untimed(value: Any) -> Any:
    """`value` with every ISO 8601 timestamp in its strings replaced (current_time results)."""
    if isinstance(value, str):
        return ISO_TIME.sub("<time>", value)
    if isinstance(value, list):
        return [untimed(v) for v in value]
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items()}
    return value


async def transcript(pool: asyncpg.Pool, run_id: str) -> dict[str, Any]:
    """What a run produced, minus what legitimately differs between models: timestamps,
    ids, durations and token counts (the fake counts tokens, the scripted model guesses)."""
    run = await details(pool, run_id)
    state = untimed(run["state_json"])
    # the compaction middleware's last measured request size: token counts differ
    state.get("private", {}).get("summarization", {}).pop("estimate", None)
    return {
        "status": run["status"],
        "error": run["error"],
        "state": state,
        "messages": [
            untimed({"role": m["role"], "content": m["content"]}) for m in run["transcript"]
        ],
        "events": [
            (e["type"], e["payload"].get("stop_reason") if isinstance(e["payload"], dict) else None)
            for e in run["events"]
        ],
    }


def everything_stored(run: dict[str, Any]) -> str:
    return json.dumps(run, default=str)


# -- (a) the demo agent, through the worker and the SDK ---------------------------------------


async def test_demo_agent_through_the_sdk_matches_the_scripted_model(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.load(load_script(DEMO_SCRIPT))
    use_anthropic(monkeypatch, fake, DEMO_KEY)
    wire_run = await demo._prepare(dsn)
    s = await work(dsn, anthropic_max_retries=0)  # the provider from the environment
    assert s.model_provider == "anthropic"
    scripted_run = await demo._prepare(dsn)
    await work(dsn, ScriptedProvider(load_script(DEMO_SCRIPT)))

    got, expected = await transcript(pool, wire_run), await transcript(pool, scripted_run)
    assert got["status"] == "succeeded", got["error"]
    assert got == expected
    assert len(got["messages"]) == 12
    assert len(fake.requests) == 6 == len(load_script(DEMO_SCRIPT))
    first = fake.requests[0]
    demo_tools = ["calculator", "current_time", "write_todos"]
    assert first.api_key == DEMO_KEY
    assert first.body["model"] == demo.DEMO_MODEL and first.body["stream"] is True
    assert sorted(t["name"] for t in first.body["tools"]) == sorted(demo_tools)
    assert [r.turn_index for r in fake.requests] == list(range(6))


def test_hango_worker_demo_subprocess_with_the_anthropic_provider(
    dsn: str, fake: FakeAnthropic
) -> None:
    fake.load(load_script(DEMO_SCRIPT))
    env = {
        **os.environ,
        "HANGO_DATABASE_URL": dsn,
        "HANGO_MODEL_PROVIDER": "anthropic",
        "HANGO_METRICS_PORT": "0",
        "ANTHROPIC_API_KEY": DEMO_KEY,
        "ANTHROPIC_BASE_URL": fake.base_url,
    }
    p = subprocess.run(
        [sys.executable, "-m", "hango_worker.cli", "demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "succeeded" in p.stdout
    assert "Claude (Anthropic Messages API)" in p.stdout  # not the scripted model
    assert "31,622,400 seconds" in p.stdout
    assert len(fake.requests) == 6 and all(r.api_key == DEMO_KEY for r in fake.requests)


# -- (b) faults, through the worker -----------------------------------------------------------

ADD = [
    {"text": "Adding.", "tool_calls": [call("calculator", expression="40 + 2")]},
    {"text": "It is 42."},
]


def with_fault(fault: dict[str, Any]) -> list[dict[str, Any]]:
    """ADD with `fault` served to the first attempt of its second turn (after a tool call)."""
    return [ADD[0], fault, ADD[1]]


@pytest.mark.parametrize(
    ("fault", "sdk_retries"),
    [
        ({"fault": "429", "retry_after": 0.01}, 2),
        ({"fault": "429", "retry_after": 0.01}, 0),
        ({"fault": "529", "retry_after": 0.01}, 2),
        ({"fault": "529", "retry_after": 0.01}, 0),
        ({"fault": "midstream_overloaded"}, 2),
    ],
    ids=["429-sdk-retries", "429-loop-retries", "529-sdk-retries", "529-loop-retries", "midstream"],
)
async def test_transient_fault_then_success_run_succeeds(
    fault: dict[str, Any],
    sdk_retries: int,
    pool: asyncpg.Pool,
    dsn: str,
    fake: FakeAnthropic,
    echo: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake.load(with_fault(fault))
    use_anthropic(monkeypatch, fake)
    run_id = await enqueue(pool, "what is 40 + 2?")
    await work(dsn, anthropic_max_retries=sdk_retries)
    run = await details(pool, run_id)
    assert run["status"] == "succeeded", run["error"]
    assert run["attempt"] == 1 and run["error"] is None
    assert run["transcript"][-1]["content"] == [{"type": "text", "text": "It is 42."}]
    second_turn = [r for r in fake.requests if r.turn_index == 1]
    assert len(second_turn) == 2
    # who retried: the SDK (its retry counter goes up) or our loop (a fresh SDK call)
    sdk_retried = sdk_retries > 0 and fault["fault"] != "midstream_overloaded"
    assert second_turn[1].headers["x-stainless-retry-count"] == ("1" if sdk_retried else "0")
    assert SECRET not in everything_stored(run)


async def test_401_fails_the_run_at_once_without_the_key(
    pool: asyncpg.Pool, dsn: str, echo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeAnthropic(ADD, api_key="the-only-valid-key") as strict:
        use_anthropic(monkeypatch, strict)
        run_id = await enqueue(pool)
        await work(dsn, anthropic_max_retries=2, model_retries=2)
    run = await details(pool, run_id)
    assert run["status"] == "failed" and run["attempt"] == 1
    err = run["error"]
    assert (err["type"], err["message"], err["status"]) == (
        "authentication_error",
        "invalid x-api-key",
        401,
    )
    assert err["request_id"] == "req_fake_000001"
    assert len(strict.requests) == 1  # neither the SDK nor our loop retried
    assert strict.requests[0].api_key == SECRET
    assert SECRET not in everything_stored(run)


async def test_400_fails_the_run_at_once_and_an_echoed_key_is_redacted(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, echo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.load(with_fault({"fault": "400", "message": f"invalid header value {SECRET}"}))
    use_anthropic(monkeypatch, fake)
    run_id = await enqueue(pool)
    await work(dsn, anthropic_max_retries=2, model_retries=2)
    run = await details(pool, run_id)
    assert run["status"] == "failed" and run["attempt"] == 1
    err = run["error"]
    assert {k: err[k] for k in ("type", "status")} == {
        "type": "invalid_request_error",
        "status": 400,
    }
    assert err["message"] == "invalid header value [redacted]"
    assert str(err["request_id"]).startswith("req_fake_")
    assert [r.turn_index for r in fake.requests] == [0, 1]  # the 400 was not retried
    stored = everything_stored(run)
    assert SECRET not in stored
    assert stored.count(err["request_id"]) >= 1


# -- (c) the repaired history is accepted by the API ------------------------------------------


async def test_repaired_dangling_tool_use_is_accepted_by_the_api(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, echo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool, calls = echo
    first = await enqueue(pool, "echo hi")
    session = (await details(pool, first))["session_id"]
    dangling = {"type": "tool_use", "id": "toolu_old", "name": "echo", "input": {"text": "hi"}}
    for seq, role, content in (
        (1, "user", [{"type": "text", "text": "echo hi"}]),
        (2, "assistant", [dangling]),  # the worker died before the result was stored
    ):
        await pool.execute(
            "INSERT INTO messages (session_id, seq, run_id, role, content) "
            "VALUES ($1, $2, $3, $4, $5)",
            session,
            seq,
            first,
            role,
            content,
        )
    await pool.execute(
        "UPDATE runs SET status = 'failed', finished_at = now() WHERE id = $1", first
    )
    second = await enqueue(pool, "did it work?", session_id=session)
    # one assistant message is in the history, so the fake plays its turn 1
    fake.load([{"text": "unused"}, {"text": "I cannot tell whether the echo ran."}])
    use_anthropic(monkeypatch, fake)
    await work(dsn, tools=(tool,))

    run = await details(pool, second)
    assert run["status"] == "succeeded", run["error"]
    assert calls == []  # not idempotent: never re-run, only repaired
    assert len(fake.requests) == 1  # accepted at once: no 400 for the dangling tool_use
    sent = fake.requests[0].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_old",
            "content": INTERRUPTED,
            "is_error": True,
        },
        # the newest message's last block carries PromptCache's moving breakpoint
        {"type": "text", "text": "did it work?", "cache_control": {"type": "ephemeral"}},
    ]


# -- (d) the worker-level contract: scripted model vs SDK → fake -------------------------------
# Text answers, parallel tool calls and thinking blocks are compared one `complete()`
# and one AgentLoop at a time in test_anthropic_provider.py; here they go through the
# whole worker (queue, middleware stack, Postgres round trip of the history).

THINK_AND_FAN_OUT = [
    {
        "thinking": "Two sums, independent: call the calculator twice at once.",
        "text": "Computing both.",
        "tool_calls": [
            call("calculator", expression="2 + 2"),
            call("calculator", expression="3 * 3"),
            call("echo", text="working"),
        ],
    },
    {"thinking": "Both results are in.", "text": "2 + 2 = 4 and 3 * 3 = 9."},
]


async def test_worker_transcript_is_the_same_through_both_models(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, echo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tool, calls = echo
    fake.load(THINK_AND_FAN_OUT)
    use_anthropic(monkeypatch, fake)
    wire_run = await enqueue(pool, "2 + 2 and 3 * 3?")
    await work(dsn, tools=(tool,))
    scripted_run = await enqueue(pool, "2 + 2 and 3 * 3?")
    await work(dsn, ScriptedProvider(THINK_AND_FAN_OUT), tools=(tool,))

    got, expected = await transcript(pool, wire_run), await transcript(pool, scripted_run)
    assert got["status"] == "succeeded", got["error"]
    assert got == expected
    assert calls == [{"text": "working"}, {"text": "working"}]
    thinking = got["messages"][1]["content"][0]
    assert thinking == {
        "type": "thinking",
        "thinking": THINK_AND_FAN_OUT[0]["thinking"],
        "signature": "scripted-0",
    }
    # the thinking block (with its signature) went back to the API unchanged
    assert fake.requests[1].body["messages"][1]["content"][0] == thinking
    results = fake.requests[1].body["messages"][2]["content"]
    assert [(b["tool_use_id"], b["content"]) for b in results] == [
        ("toolu_s0000_0", "4"),
        ("toolu_s0000_1", "9"),
        ("toolu_s0000_2", "echo: working"),
    ]


async def test_the_wind_up_call_reaches_the_api_with_tool_choice_none(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, echo: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At max_turns the last request keeps its tools but forbids them; the API (here the
    fake, which answers like it: text only) accepts the history and the run succeeds."""
    looping = [{"text": f"step {i}", "tool_calls": [call("echo", text=str(i))]} for i in range(5)]
    fake.load(looping)
    use_anthropic(monkeypatch, fake)
    run_id = await enqueue(pool, "loop")
    await work(dsn, tools=(echo[0],), max_turns=2)
    run = await details(pool, run_id)
    assert (run["status"], run["limit_reached"]) == ("succeeded", "max_turns"), run["error"]
    last = fake.requests[-1].body
    assert last["tool_choice"] == {"type": "none"} and [t["name"] for t in last["tools"]]
    assert last["messages"][-1]["content"][0]["type"] == "tool_result"
    assert "max_turns" in last["messages"][-1]["content"][-1]["text"]
    assert run["transcript"][-1]["content"] == [{"type": "text", "text": "step 2"}]
    assert len(echo[1]) == 2
