"""Model output and tool results that Postgres or a terminal refuse, tool definitions that
cannot work, and secrets in odd places: each gets a stated rule and a recorded reason.

Through public surfaces: the worker on real Postgres, the real `anthropic` SDK against
FakeAnthropic's scripted streams, tool modules loaded the way HANGO_TOOL_MODULES loads
them, `runs show` and `runs watch`, and the worker's log lines.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.provider.scripted import ScriptedProvider
from hango_worker.provider.types import (
    Message,
    ModelError,
    Provider,
    Request,
    Response,
    TextBlock,
    TextSink,
)
from hango_worker.render import LiveView, Painter
from hango_worker.service import serve
from hango_worker.store import repo
from hango_worker.testing.fake_anthropic import FakeAnthropic
from hango_worker.testing.inmem import run_agent
from hango_worker.tool.registry import Registry, ToolLoadError
from hango_worker.tool.types import Tool, ToolContext
from hango_worker.watch import watch
from tests.conftest import SpanReader
from tests.helpers import agent, call, recording_tool
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle, settings

KEY = "sk-ant-bad-output-0123456789-SECRET"
R = "\ufffd"
OBJ: dict[str, Any] = {"type": "object"}
HELLO = Message("user", [TextBlock("hello")])


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic([{"text": "unused"}]) as server:
        yield server


@pytest.fixture
async def claude(fake: FakeAnthropic) -> AsyncIterator[AnthropicProvider]:
    p = AnthropicProvider(api_key=KEY, base_url=fake.base_url, max_retries=0)
    yield p
    await p.aclose()


def tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for m in messages for b in m["content"] if b["type"] == "tool_result"]


async def raw_text(args: dict[str, Any], ctx: ToolContext) -> str:
    return "res\x00ult \udc00 end"


RAW = Tool("raw_text", "Returns text Postgres refuses.", OBJ, raw_text)


# -- NUL and lone surrogates ---------------------------------------------------------------


@pytest.mark.parametrize("model", ["scripted", "anthropic"])
async def test_nul_and_lone_surrogates_are_replaced_and_the_run_succeeds(
    pool: asyncpg.Pool,
    dsn: str,
    fake: FakeAnthropic,
    claude: AnthropicProvider,
    spans: SpanReader,
    model: str,
) -> None:
    echo, calls = recording_tool()
    await make_agent(pool, tools=["echo", "raw_text"])
    run_id = await enqueue(pool)
    script = [
        {
            "text": "nul\x00 and a lone \ud800 here",
            "tool_calls": [call("echo", text="in\x00put"), call("raw_text")],
        },
        {"text": "done"},
    ]
    provider: Provider = ScriptedProvider(script)
    if model == "anthropic":
        fake.load(script)
        provider = claude
    await run_until_idle(dsn, provider, [echo, RAW])
    run = await details(pool, run_id)
    assert run["status"] == "succeeded", run["error"]
    said = run["transcript"][1]["content"]
    assert said[0]["text"] == f"nul{R} and a lone {R} here"
    assert said[1]["input"] == {"text": f"in{R}put"}
    assert calls == [{"text": f"in{R}put"}]  # the tool got the cleaned arguments
    results = tool_results(run["transcript"])
    assert [r["content"] for r in results] == [f"echo: in{R}put", f"res{R}ult {R} end"]
    stored = [e["payload"] for e in run["events"] if e["type"] == "tool_result"]
    assert stored[1]["content"] == f"res{R}ult {R} end"
    sanitized = {
        e.attributes["hango.sanitized.where"]: e.attributes["hango.sanitized.count"]
        for e in spans.events("hango.text.sanitized")
    }
    assert sanitized == {"model_output": 3, "tool_result": 2}


# -- tool input that is not an object ------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "inputs_in_start"),
    [("scripted", False), ("anthropic", False), ("anthropic", True)],
    ids=["scripted", "anthropic-deltas", "anthropic-block-start"],
)
async def test_tool_input_that_is_not_an_object_is_answered_as_a_tool_error(
    fake: FakeAnthropic, claude: AnthropicProvider, model: str, inputs_in_start: bool
) -> None:
    echo, calls = recording_tool()
    turn: dict[str, Any] = {
        "tool_calls": [
            {"name": "echo", "input": [1, 2]},
            {"name": "echo", "input": "text"},
            {"name": "echo", "input": {"text": "fine"}},
        ]
    }
    script = [turn, {"text": "ok"}]
    provider: Provider = ScriptedProvider(script)
    if model == "anthropic":
        fake.load([{**turn, "inputs_in_start": inputs_in_start}, {"text": "ok"}])
        provider = claude
    outcome, _, mem = await run_agent(agent(tools=["echo"]), provider, tools=[echo])
    assert outcome.status == "succeeded", outcome.error
    results = tool_results([m.to_dict() for m in mem.messages])
    hint = "; send the call again with its arguments as a JSON object"
    assert [r["content"] for r in results] == [
        "not executed: arguments must be a JSON object, got array" + hint,
        "not executed: arguments must be a JSON object, got string" + hint,
        "echo: fine",
    ]
    assert calls == [{"text": "fine"}]
    uses = [b for b in mem.messages[1].to_dict()["content"] if b["type"] == "tool_use"]
    assert [u["input"] for u in uses] == [{}, {}, {"text": "fine"}]  # the API needs objects


# -- a frame that is not JSON --------------------------------------------------------------


async def test_a_stream_frame_that_is_not_json_is_a_precise_retryable_error(
    fake: FakeAnthropic, claude: AnthropicProvider, spans: SpanReader
) -> None:
    fake.load([{"fault": "midstream_garbage", "message": "{oops " + KEY}, {"text": "ok"}])
    with pytest.raises(ModelError) as err:
        await claude.complete(Request(model="m", messages=[HELLO], max_tokens=100))
    e = err.value
    assert e.type == "malformed_stream" and e.retryable is True
    assert e.message.startswith("the API sent a stream frame that is not JSON")
    assert KEY not in json.dumps(e.to_dict())
    fake.load([{"fault": "midstream_garbage", "times": 1}, {"text": "recovered"}])
    outcome, _, mem = await run_agent(agent(tools=[]), claude)
    assert outcome.status == "succeeded" and mem.messages[-1].text() == "recovered"
    [retry] = spans.events("model.retried")
    assert retry.attributes["error.type"] == "malformed_stream"


# -- invalid tool definitions are rejected when the module loads ---------------------------


async def _noop(args: dict[str, Any], ctx: ToolContext) -> str:
    return "ok"


BAD_SCHEMA = Tool(
    "bad_schema", "d", {"type": "object", "properties": {"x": {"type": "strng"}}}, _noop
)
NOT_AN_OBJECT = Tool("not_an_object", "d", {"type": "array"}, _noop)
BAD_NAME = Tool("has space", "d", OBJ, _noop)


@pytest.mark.parametrize(
    ("attr", "message"),
    [
        (
            "BAD_SCHEMA",
            "tool 'bad_schema': invalid input_schema at properties/x/type: 'strng' is not valid",
        ),
        ("NOT_AN_OBJECT", "tool 'not_an_object': input_schema must be a JSON schema with"),
        ("BAD_NAME", "tool name 'has space' must match"),
    ],
)
def test_an_invalid_tool_definition_is_rejected_when_its_module_loads(
    attr: str, message: str
) -> None:
    spec = f"tests.test_bad_output:{attr}"
    with pytest.raises(ToolLoadError) as err:
        Registry.default(load_entry_points=False, modules=spec)
    assert str(err.value).startswith(f"tool module {spec!r} failed to load: ")
    assert message in str(err.value)


def test_the_worker_refuses_to_start_with_an_invalid_tool(dsn: str, tmp_path: Any) -> None:
    script = tmp_path / "script.json"
    script.write_text('[{"text": "unused"}]')
    env = {
        **os.environ,
        "HANGO_DATABASE_URL": dsn,
        "HANGO_METRICS_PORT": "0",
        "HANGO_MODEL_PROVIDER": "scripted",
        "HANGO_SCRIPT": str(script),
        "HANGO_TOOL_MODULES": "tests.test_bad_output:BAD_SCHEMA",
    }
    p = subprocess.run(
        [sys.executable, "-m", "hango_worker.cli", "run", "--until-idle"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2, p.stderr
    assert "tool 'bad_schema': invalid input_schema" in p.stderr and "Traceback" not in p.stderr


# -- terminal control sequences never reach the operator's terminal ------------------------

ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[31m"  # retitle, clear, recolour
CONTROLS = ("\x1b", "\x07", "\x9b", "\x9d", "\x00")


async def test_runs_show_and_runs_watch_strip_terminal_control_sequences(
    pool: asyncpg.Pool, dsn: str
) -> None:
    async def loud(args: dict[str, Any], ctx: ToolContext) -> str:
        return f"{ESCAPES}tool says hi\x9b2J\x9d0;t\x9c"

    await make_agent(pool, tools=["loud"])
    run_id = await enqueue(pool)
    script = [
        {"text": f"{ESCAPES}model says hi\x1bc", "tool_calls": [call("loud")]},
        {"error": {"type": "api_error", "message": f"{ESCAPES}bad\x00 news"}},
    ]
    await run_until_idle(dsn, ScriptedProvider(script), [Tool("loud", "d", OBJ, loud)])
    assert (await details(pool, run_id))["status"] == "failed"

    out = io.StringIO()
    await watch(pool, dsn, repo.DEFAULT_TENANT_ID, run_id, LiveView(Painter(out)), timeout_s=30)
    watched = out.getvalue()
    shown = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "hango_worker.cli", "runs", "show", run_id],
        env={**os.environ, "HANGO_DATABASE_URL": dsn},
        capture_output=True,
        text=True,
        timeout=60,
    )
    shown = shown.stdout
    assert "model says hi" in shown and "tool says hi" in shown and "bad\ufffd news" in shown
    assert "model says hi" in watched and "tool says hi" in watched
    for text in (watched, shown):
        assert not [c for c in CONTROLS if c in text], repr(text)


# -- log lines never carry content unless capture is on ------------------------------------

SECRET_INPUT = "my-private-note-4711"


class Exploding:
    """A model wrapper with a bug whose exception quotes the conversation, as a database
    error quotes the value it refused."""

    name = "exploding"

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        raise RuntimeError(f"cannot handle {request.messages[-1].text()!r}")


@pytest.fixture
def root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("capture", [False, True], ids=["capture-off", "capture-on"])
async def test_a_crash_log_line_carries_content_only_when_capture_is_on(
    pool: asyncpg.Pool,
    dsn: str,
    capsys: pytest.CaptureFixture[str],
    root_logging: None,
    capture: bool,
) -> None:
    await make_agent(pool, tools=[])
    run_id = await enqueue(pool, SECRET_INPUT)
    s = settings(dsn, capture_content=capture, log_format="json")
    await serve(s, dsn, until_idle=True, provider=Exploding(), registry=Registry(), logs=True)
    run = await details(pool, run_id)
    assert run["status"] == "failed" and run["error"]["type"] == "internal_error"
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    [crash] = [x for x in lines if x["msg"] == "run crashed"]
    assert crash["run_id"] == run_id and "Traceback" in crash["exc"]
    if capture:
        assert SECRET_INPUT in crash["exc"]
    else:
        assert "RuntimeError: [message withheld" in crash["exc"]
        assert SECRET_INPUT not in json.dumps(lines)


# -- secrets in odd places -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_id", "stored"),
    [
        ("req_{api_key}", "req_[redacted]"),  # the client's own key, echoed
        ("sk-ant-someone-elses-key-0123", "[redacted]"),  # any key-shaped string
    ],
)
async def test_a_key_echoed_in_the_request_id_is_never_stored(
    pool: asyncpg.Pool,
    dsn: str,
    fake: FakeAnthropic,
    claude: AnthropicProvider,
    request_id: str,
    stored: str,
) -> None:
    await make_agent(pool, tools=[])
    run_id = await enqueue(pool)
    fake.load([{"fault": "400", "request_id": request_id, "type": f"odd_{KEY}"}, {"text": "x"}])
    await run_until_idle(dsn, claude)
    run = await details(pool, run_id)
    assert run["status"] == "failed"
    assert run["error"]["request_id"] == stored
    assert run["error"]["type"] == "odd_[redacted]"
    assert fake.requests[0].api_key == KEY  # the fake did see (and echo) the real key
    assert KEY not in json.dumps(run, default=str)
    assert "someone-elses" not in json.dumps(run, default=str)


def test_the_sanitising_rule() -> None:
    from hango_worker.provider.sanitize import clean_json, clean_text

    assert clean_text("plain") == ("plain", 0)
    assert clean_text("a\x00b\x00") == (f"a{R}b{R}", 2)
    assert clean_text("x\ud800y\udfff") == (f"x{R}y{R}", 2)
    assert clean_text("\ud83d\ude00 é") == ("\U0001f600 é", 0)  # a pair is its character
    assert clean_text(f"kept {R}\x00") == (f"kept {R}{R}", 1)
    assert clean_json({"k\x00": ["v\ud800", 1, None, {"n": "ok"}]}) == (
        {f"k{R}": [f"v{R}", 1, None, {"n": "ok"}]},
        2,
    )


def test_a_database_error_is_logged_with_its_sqlstate_not_its_message(
    capsys: pytest.CaptureFixture[str], root_logging: None
) -> None:
    from hango_worker.telemetry.logs import setup_logging

    setup_logging("INFO", "json")
    log = logging.getLogger("hango_worker.test")
    try:
        try:
            raise asyncpg.exceptions.UntranslatableCharacterError(f"JSON data: {SECRET_INPUT}")
        except asyncpg.PostgresError as e:
            raise RuntimeError(f"while storing {SECRET_INPUT}") from e
    except RuntimeError:
        log.exception("run crashed")
    try:
        raise ConnectionRefusedError(111, "Connection refused")
    except OSError:
        log.exception("claim failed")
    crash, claim = (json.loads(x) for x in capsys.readouterr().out.splitlines())
    assert SECRET_INPUT not in crash["exc"]
    assert "UntranslatableCharacterError (SQLSTATE 22P05): [message withheld" in crash["exc"]
    assert "RuntimeError: [message withheld" in crash["exc"] and "which led to" in crash["exc"]
    assert claim["exc"].endswith("ConnectionRefusedError: [Errno 111] Connection refused")
