"""MCP tools (tool/mcp_client.py, tool/mcp_config.py): an agent's MCP servers opened per
attempt through the `mcp` SDK, their tools offered as `mcp__<server>__<tool>`, against
the test server hango_worker/testing/mcp_server.py over stdio and streamable HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import uvicorn
from prometheus_client import REGISTRY
from pydantic import ValidationError

from hango_worker.agent.loop import RunInfo
from hango_worker.agent.spec import AgentConfig, AgentSpec
from hango_worker.agent.state import State
from hango_worker.provider.types import Message, TextBlock, ToolResultBlock, ToolUseBlock
from hango_worker.store import repo
from hango_worker.testing import mcp_server
from hango_worker.testing.inmem import MemoryRunIO, run_agent
from hango_worker.tool.mcp_client import IDEMPOTENCY_KEY, RUN_KEY
from tests.conftest import SpanReader
from tests.helpers import agent, call, scripted
from tests.test_chain import CapturingProvider
from tests.test_cli import cli
from tests.worker_helpers import details, make_agent, run_until_idle

DEMO: dict[str, Any] = {
    "name": "demo",
    "command": sys.executable,
    "args": ["-m", "hango_worker.testing.mcp_server"],
}
DEMO_TOOLS = [
    "add",
    "busy",
    "crash",
    "echo",
    "extra",
    "fail",
    "headers",
    "meta",
    "pid",
    "pixel",
    "slow",
]
LISTED = sorted(t for t in DEMO_TOOLS if t != "extra")


def demo(**over: Any) -> dict[str, Any]:
    return {**DEMO, **over}


def results(messages: list[Message]) -> dict[str, ToolResultBlock]:
    return {b.tool_use_id: b for m in messages for b in m.content if isinstance(b, ToolResultBlock)}


def uses(messages: list[Message]) -> dict[str, ToolUseBlock]:
    return {b.name: b for m in messages for b in m.content if isinstance(b, ToolUseBlock)}


def listed_event(io: MemoryRunIO) -> dict[str, Any]:
    (event,) = [e.payload for e in io.events if e.type == "mcp_tools"]
    return event["servers"]


async def test_a_worker_runs_mcp_tools_over_stdio(pool: asyncpg.Pool, dsn: str) -> None:
    tools = ["mcp__demo__echo", "mcp__demo__meta", "mcp__demo__fail"]
    await make_agent(pool, name="mcp", tools=tools, config={"mcp_servers": [DEMO]})
    enqueued = await repo.enqueue_run(
        pool, tenant_id=repo.DEFAULT_TENANT_ID, agent="mcp", input_text="go"
    )
    batch = [
        call("mcp__demo__echo", text="hello"),
        call("mcp__demo__meta"),
        call("mcp__demo__fail", message="boom"),
    ]
    provider = CapturingProvider(scripted({"tool_calls": batch}, {"text": "done"}))
    await run_until_idle(dsn, provider)
    run = await details(pool, enqueued.run_id)
    assert run["status"] == "succeeded", run["error"]
    # the agent's order, each with the server's own JSON schema
    request_tools = provider.requests[0].tools
    assert [t.name for t in request_tools] == tools
    assert request_tools[0].input_schema["properties"]["text"]["type"] == "string"
    calls = [b for r in run["transcript"] for b in r["content"] if b["type"] == "tool_use"]
    answers = {
        b["tool_use_id"]: b
        for r in run["transcript"]
        for b in r["content"]
        if b["type"] == "tool_result"
    }
    echo, meta, fail = (answers[c["id"]] for c in calls)
    assert (echo["content"], echo.get("is_error", False)) == ("hello", False)
    assert json.loads(meta["content"])[IDEMPOTENCY_KEY] == calls[1]["id"]
    assert json.loads(meta["content"])[RUN_KEY] == enqueued.run_id
    assert fail["is_error"] is True and "boom" in fail["content"]
    (event,) = [e for e in run["events"] if e["type"] == "mcp_tools"]
    assert event["payload"]["servers"]["demo"]["tools"] == LISTED


def calls_counted(outcome: str) -> float:
    labels = {"server": "demo", "outcome": outcome}
    return REGISTRY.get_sample_value("hango_mcp_calls_total", labels) or 0.0


async def test_each_call_is_counted_and_named_on_its_tool_span(spans: SpanReader) -> None:
    a = agent(tools=["mcp__demo__echo", "mcp__demo__fail"], mcp_servers=[DEMO])
    before = calls_counted("ok"), calls_counted("error")
    batch = [call("mcp__demo__echo", text="x"), call("mcp__demo__fail", message="no")]
    await run_agent(a, scripted({"tool_calls": batch}, {"text": "ok"}))
    assert (calls_counted("ok"), calls_counted("error")) == (before[0] + 1, before[1] + 1)
    named = {s.attributes["gen_ai.tool.name"]: s.attributes for s in spans.named("execute_tool")}
    assert named["mcp__demo__echo"]["hango.mcp.server"] == "demo"
    assert named["mcp__demo__fail"]["hango.mcp.tool"] == "fail"


async def test_a_server_allowlist_offers_its_tools_sorted_after_the_agents() -> None:
    a = agent(tools=["calculator"], mcp_servers=[demo(tools=["*"])])
    provider = CapturingProvider(scripted({"text": "ok"}))
    outcome, _, io = await run_agent(a, provider)
    assert outcome.status == "succeeded"
    names = [t.name for t in provider.requests[0].tools]
    assert names == ["calculator", *(f"mcp__demo__{t}" for t in LISTED)]
    assert listed_event(io)["demo"]["changed"] is False


async def test_a_server_allowlist_by_name_offers_only_those() -> None:
    a = agent(tools=[], mcp_servers=[demo(tools=["echo", "add"])])
    provider = CapturingProvider(
        scripted({"tool_calls": [call("mcp__demo__add", a=2, b=3)]}, {"text": "5"})
    )
    _, state, _ = await run_agent(a, provider)
    assert [t.name for t in provider.requests[0].tools] == ["mcp__demo__add", "mcp__demo__echo"]
    (answer,) = results(state.messages).values()
    assert (answer.content, answer.is_error) == ("5", False)


async def test_an_image_result_is_an_image_block() -> None:
    a = agent(tools=["mcp__demo__pixel"], mcp_servers=[DEMO])
    _, state, _ = await run_agent(
        a, scripted({"tool_calls": [call("mcp__demo__pixel")]}, {"text": "ok"})
    )
    (answer,) = results(state.messages).values()
    assert not answer.is_error
    assert answer.blocks is not None and answer.blocks[0]["type"] == "image"


async def test_a_call_that_takes_too_long_is_an_error_naming_the_server() -> None:
    a = agent(tools=["mcp__demo__slow"], mcp_servers=[demo(timeout_s=1)])
    outcome, state, _ = await run_agent(
        a, scripted({"tool_calls": [call("mcp__demo__slow", seconds=600)]}, {"text": "ok"})
    )
    assert outcome.status == "succeeded"
    (answer,) = results(state.messages).values()
    assert answer.is_error and "MCP server 'demo' did not answer" in answer.content


async def test_max_concurrency_bounds_the_calls_to_a_server_at_once() -> None:
    a = agent(tools=["mcp__demo__busy"], mcp_servers=[demo(max_concurrency=1)])
    batch = [call("mcp__demo__busy", seconds=s) for s in (0.05, 0.06, 0.07)]  # not repeats
    outcome, state, _ = await run_agent(a, scripted({"tool_calls": batch}, {"text": "ok"}))
    assert outcome.status == "succeeded"
    assert [r.content for r in results(state.messages).values()] == ["1", "1", "1"]


async def test_a_server_that_cannot_start_leaves_its_tools_out_and_the_run_goes_on() -> None:
    down = {"name": "down", "command": "/nonexistent/mcp-server", "tools": ["*"]}
    a = agent(tools=["calculator", "mcp__demo__echo"], mcp_servers=[down, DEMO])
    provider = CapturingProvider(scripted({"text": "ok"}))
    outcome, _, io = await run_agent(a, provider)
    assert outcome.status == "succeeded"
    assert [t.name for t in provider.requests[0].tools] == ["calculator", "mcp__demo__echo"]
    servers = listed_event(io)
    assert "MCP server 'down' could not be opened" in servers["down"]["error"]


async def test_a_server_that_never_answers_is_left_out_after_open_timeout_s() -> None:
    mute = {
        "name": "mute",
        "command": sys.executable,
        "args": ["-c", "import time; time.sleep(600)"],
        "tools": ["*"],
        "open_timeout_s": 1,
    }
    outcome, _, io = await run_agent(agent(tools=[], mcp_servers=[mute]), scripted({"text": "ok"}))
    assert outcome.status == "succeeded"
    assert "did not answer within 1 s while opening" in listed_event(io)["mute"]["error"]


async def test_a_secret_not_set_leaves_the_server_out_naming_the_variable() -> None:
    server = demo(tools=["*"], env={"DEMO_TOKEN": {"env": "HANGO_TEST_UNSET_TOKEN"}})
    outcome, _, io = await run_agent(
        agent(tools=[], mcp_servers=[server]), scripted({"text": "ok"})
    )
    assert outcome.status == "succeeded"
    assert "HANGO_TEST_UNSET_TOKEN is not set" in listed_event(io)["demo"]["error"]


async def test_a_server_that_dies_mid_run_is_an_error_naming_it_and_closed_at_the_end() -> None:
    a = agent(tools=[], mcp_servers=[demo(tools=["pid", "crash", "echo"])])
    turns = scripted(
        {"tool_calls": [call("mcp__demo__pid")]},
        {"tool_calls": [call("mcp__demo__crash")]},
        {"tool_calls": [call("mcp__demo__echo", text="still there?")]},
        {"text": "ok"},
    )
    outcome, state, _ = await run_agent(a, turns)
    assert outcome.status == "succeeded", outcome.error
    pid, crashed, echo = results(state.messages).values()
    assert crashed.is_error and "MCP server 'demo'" in crashed.content
    assert echo.is_error and "MCP server 'demo'" in echo.content
    with pytest.raises(ProcessLookupError):  # gone, and reaped
        os.kill(int(pid.content), 0)


async def test_the_server_process_ends_with_the_attempt() -> None:
    a = agent(tools=["mcp__demo__pid"], mcp_servers=[DEMO])
    _, state, _ = await run_agent(
        a, scripted({"tool_calls": [call("mcp__demo__pid")]}, {"text": "ok"})
    )
    (pid,) = results(state.messages).values()
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid.content), 0)


async def test_a_changed_tool_list_is_picked_up_and_recorded_at_the_next_attempt() -> None:
    first = agent(tools=[], mcp_servers=[demo(tools=["*"])])
    _, state, io = await run_agent(first, scripted({"text": "one"}))
    assert listed_event(io)["demo"]["changed"] is False
    state.messages.append(Message("user", [TextBlock("again")]))
    second = agent(tools=[], mcp_servers=[demo(tools=["*"], env={"HANGO_MCP_DEMO_EXTRA": "1"})])
    provider = CapturingProvider(scripted({"text": "two"}))
    _, _, io = await run_agent(second, provider, state=state)
    servers = listed_event(io)
    assert servers["demo"]["changed"] is True and "extra" in servers["demo"]["tools"]
    assert "mcp__demo__extra" in [t.name for t in provider.requests[0].tools]


async def test_an_approval_rule_holds_an_mcp_tool_call() -> None:
    a = agent(
        tools=["mcp__demo__echo"],
        mcp_servers=[DEMO],
        approvals=[{"tool": "mcp__demo__echo"}],
    )
    outcome, state, _ = await run_agent(
        a, scripted({"tool_calls": [call("mcp__demo__echo", text="x")]}, {"text": "ok"})
    )
    assert outcome.status == "waiting"
    assert not results(state.messages)  # nothing ran


async def test_an_unlisted_mcp_tool_is_denied_by_the_allowlist() -> None:
    a = agent(tools=["mcp__demo__echo"], mcp_servers=[DEMO])
    _, state, _ = await run_agent(
        a, scripted({"tool_calls": [call("mcp__demo__add", a=1, b=1)]}, {"text": "ok"})
    )
    (answer,) = results(state.messages).values()
    assert answer.is_error and "not allowed" in answer.content


async def test_a_call_a_crash_interrupted_is_answered_interrupted_never_re_run() -> None:
    a = agent(tools=["mcp__demo__echo"], mcp_servers=[DEMO])
    pending = ToolUseBlock(id="toolu_crashed", name="mcp__demo__echo", input={"text": "x"})
    state = State(
        run_id="run-1",
        session_id="s-1",
        agent_id=a.id,
        tenant_id="t",
        messages=[Message("user", [TextBlock("go")]), Message("assistant", [pending])],
    )
    info = RunInfo(persisted=2, turns_done=1)
    turns = scripted({"text": "(turn 1, before the crash)"}, {"text": "ok"})
    outcome, state, _ = await run_agent(a, turns, state=state, info=info)
    assert outcome.status == "succeeded", outcome.error
    answer = results(state.messages)["toolu_crashed"]
    assert answer.is_error and "interrupted" in answer.content


def spec(tools: list[str], servers: list[dict[str, Any]]) -> AgentSpec:
    return AgentSpec(
        id="a",
        name="a",
        model="m",
        tools=tools,
        config=AgentConfig.model_validate({"mcp_servers": servers}),
    )


@pytest.mark.parametrize(
    ("tools", "servers", "why"),
    [
        (["mcp__nope__x"], [DEMO], "names MCP server 'nope'"),
        ([], [DEMO], "MCP server 'demo' offers no tool"),
        ([], [demo(tools=["*"], url="http://x")], "either url"),
        ([], [{"name": "a_b", "url": "http://x", "tools": ["*"]}], "must match"),
        ([], [demo(tools=["*"]), demo(tools=["*"])], "used twice"),
        (
            [],
            [{"name": "h", "url": "http://x", "tools": ["*"], "headers": {"Authorization": "x"}}],
            "holds a literal value",
        ),
        ([], [demo(tools=["*"], env={"API_KEY": "literal"})], "holds a literal value"),
        ([], [demo(tools=["*"], env={"X": {"env": "A", "file": "b"}})], "secret reference"),
    ],
)
def test_a_bad_server_config_is_refused_in_one_line(
    tools: list[str], servers: list[dict[str, Any]], why: str
) -> None:
    with pytest.raises(ValidationError) as e:
        spec(tools, servers)
    assert why in str(e.value)


@pytest.fixture
async def http_server() -> AsyncIterator[str]:
    """The test server over streamable HTTP on a port of its own (listening before the
    server starts, so a client connecting early waits in the backlog)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    app = mcp_server.build().streamable_http_app(host="127.0.0.1")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    yield f"http://127.0.0.1:{port}/mcp"
    server.should_exit = True
    await task
    sock.close()


async def test_streamable_http_with_a_header_from_a_secret_reference(
    http_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HANGO_TEST_MCP_TOKEN", "Bearer s3cret")
    server = {
        "name": "web",
        "url": http_server,
        "headers": {"Authorization": {"env": "HANGO_TEST_MCP_TOKEN"}},
    }
    a = agent(tools=["mcp__web__echo", "mcp__web__headers"], mcp_servers=[server])
    batch = [call("mcp__web__echo", text="over http"), call("mcp__web__headers")]
    outcome, state, _ = await run_agent(a, scripted({"tool_calls": batch}, {"text": "ok"}))
    assert outcome.status == "succeeded"
    by_name = uses(state.messages)
    answers = results(state.messages)
    assert answers[by_name["mcp__web__echo"].id].content == "over http"
    seen = json.loads(answers[by_name["mcp__web__headers"].id].content)
    assert seen["authorization"] == "Bearer s3cret"


def test_the_cli_creates_an_agent_with_mcp_tools_and_refuses_an_undefined_server(
    dsn: str,
) -> None:
    config = json.dumps({"mcp_servers": [DEMO]})
    create = ("agents", "create", "--model", "m", "--config", config)
    cli(dsn, *create, "--name", "mcp-cli", "--tool", "mcp__demo__echo")
    p = cli(dsn, *create, "--name", "mcp-cli-2", "--tool", "mcp__other__echo", ok=False)
    assert p.returncode == 2
    (line,) = p.stderr.strip().splitlines()
    assert "names MCP server 'other'" in line
