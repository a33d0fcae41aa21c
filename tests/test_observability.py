"""Traces through the real OTLP exporter into the receiver; /metrics and /readyz over HTTP;
no contents anywhere."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import urllib.request
from typing import Any

import asyncpg
from prometheus_client.parser import text_string_to_metric_families

from hango_worker.run.worker import Worker
from hango_worker.service import serve
from hango_worker.store.migrate import head_revision
from hango_worker.telemetry.logs import JsonFormatter
from hango_worker.telemetry.metrics_server import MetricsServer
from hango_worker.testing import OTLPReceiver
from hango_worker.tool.registry import Registry
from tests.helpers import call, recording_tool, scripted
from tests.worker_helpers import enqueue, make_agent, settings

SECRET_INPUT = "SENTINEL-INPUT-7f3a"
SECRET_TODO = "SENTINEL-TODO-91bc"
SECRET_ARG = "SENTINEL-ARG-44de"
SECRET_TEXT = "SENTINEL-TEXT-0a12"


def _script() -> list[dict[str, Any]]:
    same = call("echo", text=SECRET_ARG)
    plan = [{"content": SECRET_TODO, "status": "in_progress"}]
    return [
        {"text": SECRET_TEXT, "tool_calls": [call("write_todos", todos=plan), same]},
        {"tool_calls": [same, call("calculator", expression="1+1")]},  # calculator not allowed
        {"tool_calls": [same]},  # third identical: blocked
        {"text": f"done {SECRET_TEXT}"},
    ]


async def _run_once(
    pool: asyncpg.Pool, dsn: str, rx: OTLPReceiver, monkeypatch: Any
) -> tuple[str, str]:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rx.endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "hango-worker")
    tool, _ = recording_tool()
    await make_agent(pool, name="observed", tools=["echo", "write_todos"])
    run_id = await enqueue(pool, SECRET_INPUT, agent="observed")
    registry = Registry([tool])
    log_buf = io.StringIO()
    handler = logging.StreamHandler(log_buf)
    handler.setFormatter(JsonFormatter())
    logging.getLogger().addHandler(handler)
    try:
        await serve(
            settings(dsn),
            dsn,
            until_idle=True,
            provider=scripted(*_script()),
            registry=registry,
            logs=False,
        )
    finally:
        logging.getLogger().removeHandler(handler)
    return run_id, log_buf.getvalue()


async def test_span_tree_events_and_genai_attributes_on_the_wire(
    pool: asyncpg.Pool, dsn: str, monkeypatch: Any
) -> None:
    with OTLPReceiver() as rx:
        run_id, logs = await _run_once(pool, dsn, rx, monkeypatch)
        rx.wait_for("invoke_agent observed", timeout=10)
        root = rx.find("invoke_agent observed")
    assert root.kind == "INTERNAL" and root.resource["service.name"] == "hango-worker"
    a = root.attributes
    assert a["gen_ai.operation.name"] == "invoke_agent" and a["gen_ai.agent.name"] == "observed"
    assert a["hango.run.id"] == run_id and a["hango.run.attempt"] == 1
    assert a["gen_ai.conversation.id"] and a["gen_ai.request.model"] == "claude-test"
    stack = root.event("agent.middleware_stack").attributes["hango.middleware.names"]
    assert list(stack) == [
        "filesystem",
        "summarization",
        "repair_tool_calls",
        "todo",
        "repeat_call",
        "prompt_cache",
        "human_in_the_loop",
        "tool_allowlist",
    ]
    children = rx.children(root)
    turns = [s for s in children if s.name.startswith("turn ")]
    assert [t.name for t in turns] == ["turn 1", "turn 2", "turn 3", "turn 4"]
    before = [s for s in children if s.name == "agent.before_run"]
    assert len(before) == 1
    assert [s.attributes["hango.middleware.name"] for s in rx.children(before[0])] == [
        "repair_tool_calls"
    ]
    chats = [s for t in turns for s in rx.children(t) if s.name.startswith("chat ")]
    assert len(chats) == 4 and all(c.kind == "CLIENT" for c in chats)
    c0 = chats[0].attributes
    assert c0["gen_ai.operation.name"] == "chat"
    assert list(c0["gen_ai.response.finish_reasons"]) == ["tool_use"]
    assert c0["gen_ai.usage.input_tokens"] > 0 and "gen_ai.usage.output_tokens" in c0
    assert "gen_ai.usage.cache_read.input_tokens" in c0
    tools = [s for t in turns for s in rx.children(t) if s.name.startswith("execute_tool ")]
    names = [s.attributes["gen_ai.tool.name"] for s in tools]
    assert names == ["write_todos", "echo", "echo", "calculator", "echo"]
    assert all(
        s.attributes["gen_ai.tool.type"] == "function" and s.attributes["gen_ai.tool.call.id"]
        for s in tools
    )
    blocked = [s for s in tools if s.status_code == "ERROR"]
    assert [s.attributes["gen_ai.tool.name"] for s in blocked] == ["echo"]  # repeat-blocked
    # a call the allowlist denies is an expected outcome: recorded, not an error
    (denied,) = [s for s in tools if s.attributes.get("hango.tool.denied_by")]
    assert denied.attributes["gen_ai.tool.name"] == "calculator"
    assert denied.status_code == "UNSET" and denied.event("tool.denied")
    events = {e.name: e for t in turns for e in t.events}
    assert events["agent.todos_updated"].attributes["hango.todos.in_progress"] == 1
    assert events["middleware.repeat_call_blocked"].attributes["gen_ai.tool.name"] == "echo"
    assert events["middleware.short_circuited"].attributes["hango.middleware.name"] in (
        "tool_allowlist",
        "repeat_call",
    )
    assert turns[0].attributes["langfuse.observation.metadata.todos_total"] == 1
    # nothing exported contains contents: message text, todo text, tool arguments
    everything = json.dumps([s.__dict__ for s in rx.spans()], default=str) + logs
    for sentinel in (SECRET_INPUT, SECRET_TODO, SECRET_ARG, SECRET_TEXT):
        assert sentinel not in everything
    log_lines = [json.loads(x) for x in logs.splitlines() if x.strip()]
    assert all("trace_id" in ln for ln in log_lines if ln.get("run_id"))


def _scrape(port: int, path: str = "/metrics") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


EXPECTED = {
    "hango_middleware_before_run_duration_seconds": ("histogram", {"middleware"}),
    "hango_middleware_tool_short_circuits": ("counter", {"middleware"}),
    "hango_middleware_repeat_blocked": ("counter", {"gen_ai_tool_name"}),
    "hango_runs_claimed": ("counter", set()),
    "hango_runs_finished": ("counter", {"status"}),
    "hango_run_duration_seconds": ("histogram", {"status"}),
    "hango_queue_depth": ("gauge", set()),
    "hango_queue_claimable": ("gauge", set()),
    "hango_queue_oldest_age_seconds": ("gauge", set()),
    "hango_lease_reclaims": ("counter", set()),
    "hango_model_tokens": ("counter", {"type"}),
    "gen_ai_client_operation_duration_seconds": (
        "histogram",
        {"gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "error_type"},
    ),
    "gen_ai_client_token_usage": (
        "histogram",
        {
            "gen_ai_operation_name",
            "gen_ai_provider_name",
            "gen_ai_request_model",
            "gen_ai_token_type",
        },
    ),
}


def _values(text: str) -> dict[str, Any]:
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    return fams


async def _readyz_becomes(port: int, want: int) -> int:
    """/readyz's status once it is `want` (bounded: gives up after ~10 s)."""
    for _ in range(100):
        code = (await asyncio.to_thread(_scrape, port, "/readyz"))[0]
        if code == want:
            break
        await asyncio.sleep(0.1)
    return int(code)


async def test_metrics_move_and_readyz_follows_the_database(pool: asyncpg.Pool, dsn: str) -> None:
    tool, _ = recording_tool()
    await make_agent(pool, tools=["echo", "write_todos"])
    ready: dict[str, Any] = {}

    def on_ready(worker: Worker, server: MetricsServer | None) -> None:
        ready["worker"], ready["server"] = worker, server

    task = asyncio.create_task(
        serve(
            settings(dsn),
            dsn,
            provider=scripted(*_script()),
            registry=Registry([tool]),
            logs=False,
            on_ready=on_ready,
        )
    )
    while "server" not in ready:
        await asyncio.sleep(0.02)
    port = ready["server"].port
    before = _values((await asyncio.to_thread(_scrape, port))[1])
    await enqueue(pool, "go")
    for _ in range(200):
        if (await pool.fetchval("SELECT status FROM runs")) == "succeeded":
            break
        await asyncio.sleep(0.05)
    await ready["worker"].sweep()
    status, text = await asyncio.to_thread(_scrape, port)
    assert status == 200 and "_created" not in text
    fams = _values(text)
    for name, (kind, labels) in EXPECTED.items():
        assert name in fams, f"{name} missing from /metrics"
        assert fams[name].type == kind, name
        for sample in fams[name].samples:
            assert labels <= set(sample.labels) | {"le"}, (name, sample.labels)
            assert "run_id" not in sample.labels

    def total(fams: dict[str, Any], name: str, **labels: str) -> float:
        return (
            sum(
                s.value
                for s in fams[name].samples
                if s.name in (name, name + "_total")
                and all(s.labels.get(k) == v for k, v in labels.items())
            )
            if name in fams
            else 0.0
        )

    assert (
        total(fams, "hango_runs_finished", status="succeeded")
        - total(before, "hango_runs_finished", status="succeeded")
        == 1
    )
    assert total(fams, "hango_middleware_repeat_blocked", gen_ai_tool_name="echo") >= 1
    assert total(fams, "hango_model_tokens", type="output") > total(
        before, "hango_model_tokens", type="output"
    )
    assert (await asyncio.to_thread(_scrape, port, "/healthz"))[0] == 200
    assert await _readyz_becomes(port, 200) == 200
    await pool.execute("UPDATE alembic_version SET version_num = 'older'")
    assert await _readyz_becomes(port, 503) == 503  # once the cached result (1 s) expires
    await pool.execute("UPDATE alembic_version SET version_num = $1", head_revision())
    assert await _readyz_becomes(port, 200) == 200
    ready["worker"].request_shutdown()
    await asyncio.wait_for(task, 10)


def test_dashboard_and_alert_metrics_exist_in_a_live_scrape() -> None:
    """Every metric the dashboard and alerts query is in /metrics output (names, not values)."""
    import re
    from pathlib import Path

    import yaml
    from prometheus_client import REGISTRY, generate_latest

    fams = list(text_string_to_metric_families(generate_latest(REGISTRY).decode()))
    live = {f.name for f in fams}
    label_names = {
        k for c in list(REGISTRY._collector_to_names) for k in getattr(c, "_labelnames", ())
    }
    names = set()
    for s in live:
        names |= {s, s + "_total", s + "_bucket", s + "_sum", s + "_count"}
    root = Path(__file__).resolve().parent.parent / "deploy"
    queries = []
    dash = json.loads((root / "grafana/dashboards/hango-worker.json").read_text())
    queries += re.findall(r'"expr":\s*"((?:[^"\\]|\\.)*)"', json.dumps(dash))
    for group in yaml.safe_load((root / "prometheus/alerts.yaml").read_text())["groups"]:
        queries += [r["expr"] for r in group["rules"]]
    used = {m for q in queries for m in re.findall(r"\b((?:hango|gen_ai)_[a-z0-9_]+)", q)}
    used -= label_names
    assert used and used <= names, sorted(used - names)


async def test_a_resumed_run_stays_in_one_trace_linked_to_its_previous_attempt(
    pool: asyncpg.Pool, dsn: str, spans: Any
) -> None:
    from hango_worker.store import repo
    from hango_worker.tool.types import Tool, ToolContext, ToolResult

    once = {"done": False}

    async def stop_once(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if not once["done"]:
            once["done"] = True
            await repo.request_cancel(pool, repo.DEFAULT_TENANT_ID, ctx.run_id)
        return ToolResult("ok")

    stopper = Tool("stopper", "Cancels once.", {"type": "object"}, stop_once)
    await make_agent(pool, name="traced", tools=["stopper"])
    run_id = await enqueue(pool, agent="traced")
    script = [{"tool_calls": [call("stopper")]}, {"text": "done"}]

    async def attempt() -> str:
        await serve(
            settings(dsn),
            dsn,
            until_idle=True,
            provider=scripted(*script),
            registry=Registry([stopper]),
            logs=False,
        )
        return str(await pool.fetchval("SELECT status FROM runs WHERE id = $1", run_id))

    assert await attempt() == "cancelled"
    await repo.resume(pool, repo.DEFAULT_TENANT_ID, run_id)
    assert await attempt() == "succeeded"
    roots = spans.named("invoke_agent traced")
    assert [s.attributes["hango.run.attempt"] for s in roots] == [1, 2]
    first, second = roots
    assert first.context.trace_id == second.context.trace_id
    assert [link.context.trace_id for link in second.links] == [first.context.trace_id]


async def test_capture_content_is_opt_in(spans: Any) -> None:
    from hango_worker.testing.inmem import run_agent
    from tests.helpers import agent

    provider = scripted(
        {"text": SECRET_TEXT, "tool_calls": [call("calculator", expression="1+1")]}, {"text": "ok"}
    )
    await run_agent(agent(), provider, capture_content=False)
    assert SECRET_TEXT not in json.dumps([dict(s.attributes) for s in spans.all()])
    spans.exporter.clear()
    provider = scripted(
        {"text": SECRET_TEXT, "tool_calls": [call("calculator", expression="1+1")]}, {"text": "ok"}
    )
    await run_agent(agent(), provider, capture_content=True)
    chat = spans.named("chat ")[0]
    assert SECRET_TEXT in chat.attributes["gen_ai.output.messages"]
    tool = spans.named("execute_tool calculator")[0]
    assert tool.attributes["gen_ai.tool.call.result"] == "2"
