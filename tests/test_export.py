"""Runs as fixtures: a run recorded by the worker on Postgres (against the fake Messages
API, with tools), exported with `hango-worker runs export`, then (a) replayed in a
plain test that uses only `hango_worker.testing` and the scripted model or the fake
server through the real SDK, with the same answer and transcript; (b) imported into
another database, where `replay` says identical and `runs show` shows it; (c) exported
with `--redact`, which leaves no match in the file."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from hango_worker.client import Client
from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.provider.scripted import ScriptedProvider
from hango_worker.store import db
from hango_worker.testing import FakeAnthropic, load_export, run_agent
from tests.conftest import fresh_database
from tests.helpers import call, recording_tool, scripted
from tests.test_cli import cli
from tests.test_content_input import image, png
from tests.test_replay import do_replay, record, snapshot, turns
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle

# the tools installed where the run is exported: the worker's echo, as a tool module
ECHO = recording_tool()[0]
TOOLS = {"HANGO_TOOL_MODULES": "tests.test_export:ECHO"}


@pytest.fixture
async def fake() -> AsyncIterator[FakeAnthropic]:
    with FakeAnthropic(turns()) as f:
        yield f


@pytest.fixture
async def exported(pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, tmp_path: Path) -> Path:
    """A run of three model calls with tools (echo, calculator, write_todos, a server
    tool), recorded by the worker and exported to a file."""
    run_id = await record(pool, dsn, fake, ["echo", "calculator", "write_todos"])
    path = tmp_path / "run.json"
    cli(dsn, "runs", "export", run_id, "--output", str(path), env=TOOLS)
    return path


@pytest.fixture
async def other(pg_admin_dsn: str, template_db: str) -> AsyncIterator[str]:
    """Another database, migrated, with nothing in it."""
    async with fresh_database(pg_admin_dsn, "hango_t", template_db) as d:
        yield d


def read(path: Path) -> Any:
    return json.loads(path.read_text())


def write(path: Path, text: str) -> None:
    path.write_text(text)


def transcript(messages: Any) -> list[dict[str, Any]]:
    return [{"role": m.role, "content": m.stored_content()} for m in messages]


# -- (a) a user's own test --------------------------------------------------------------


async def test_an_exported_run_replays_in_a_plain_test_with_the_scripted_model(
    exported: Path,
) -> None:
    run = load_export(exported)
    outcome, state, _ = await run_agent(
        run.agent(),
        ScriptedProvider(run.script()),
        tools=run.tools(),
        state=run.state(),
        params=run.params,
        limits=run.limits(),
    )
    assert outcome.status == "succeeded", outcome.error
    assert state.messages[-1].text() == run.final_text == "The answer is 42."
    assert transcript(state.messages) == run.transcript


async def test_an_exported_run_replays_against_the_fake_server_through_the_sdk(
    exported: Path,
) -> None:
    run = load_export(exported)
    with FakeAnthropic(run.script()) as fake:
        claude = AnthropicProvider(api_key="test-key", base_url=fake.base_url, max_retries=0)
        try:
            outcome, state, _ = await run_agent(
                run.agent(), claude, tools=run.tools(), state=run.state(), params=run.params
            )
        finally:
            await claude.aclose()
    assert outcome.status == "succeeded", outcome.error
    assert len(fake.requests) == 3
    assert transcript(state.messages) == run.transcript


async def test_the_strict_provider_checks_every_request_against_its_fingerprint(
    exported: Path,
) -> None:
    run = load_export(exported)
    same = run.provider()
    outcome, _, _ = await run_agent(
        run.agent(), same, tools=run.tools(), state=run.state(), params=run.params
    )
    assert outcome.status == "succeeded" and same.divergence is None, (
        same.divergence,
        outcome.error,
    )
    assert len(same.requests) == 3
    changed = run.agent().model_copy(update={"system": ["Be terse."]})
    strict = run.provider()
    outcome, _, _ = await run_agent(
        changed, strict, tools=run.tools(), state=run.state(), params=run.params
    )
    assert outcome.status == "failed"
    assert strict.divergence is not None and strict.divergence.field == "system"


async def test_tools_given_run_instead_of_their_recorded_results(exported: Path) -> None:
    from hango_worker.tool.types import Tool, ToolContext, ToolResult

    ran: list[Any] = []

    async def shout(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        ran.append(args)
        return ToolResult(f"ECHO: {args['text']}")

    run = load_export(exported)
    echo = Tool("echo", "Echoes its text.", {"type": "object"}, shout)
    outcome, state, _ = await run_agent(
        run.agent(), ScriptedProvider(run.script()), tools=run.tools([echo]), state=run.state()
    )
    assert outcome.status == "succeeded" and ran == [{"text": "hi"}]
    assert "ECHO: hi" in json.dumps(transcript(state.messages))


# -- (b) import into another database ---------------------------------------------------


async def test_an_imported_run_replays_identical_in_another_database(
    exported: Path, other: str
) -> None:
    out = cli(other, "runs", "import", str(exported), "--json")
    ids = json.loads(out.stdout)
    assert ids["agent"] == "agent-imported"
    shown = json.loads(cli(other, "runs", "show", ids["run_id"], "--json").stdout)
    assert shown["status"] == "succeeded"
    doc = read(exported)
    pool = await db.create_pool(other, min_size=1, max_size=4)
    try:
        before = await snapshot(pool)
        report = await do_replay(pool, other, ids["run_id"])
        assert report.identical, report.divergence
        assert (report.requests, report.recorded, report.basis) == (3, 3, "recorded")
        assert await snapshot(pool) == before
        # imported again: the agent is reused, the run is another one
        again = json.loads(cli(other, "runs", "import", str(exported), "--json").stdout)
        assert again["agent_id"] == ids["agent_id"] and again["run_id"] != ids["run_id"]
        # and exported from there, it is the same run
        back = Path(exported.parent / "back.json")
        cli(other, "runs", "export", ids["run_id"], "--output", str(back))
        redo = read(back)
        for key in ("input", "messages", "tool_results", "blobs"):
            assert redo[key] == doc[key], key
        assert [e["payload"] for e in redo["events"]] == [e["payload"] for e in doc["events"]]
    finally:
        await pool.close()


async def test_import_refuses_a_file_that_is_not_an_export(other: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something-else"}))
    p = cli(other, "runs", "import", str(bad), ok=False)
    assert p.returncode == 2 and "hango-run/1" in p.stderr


# -- (c) redaction ----------------------------------------------------------------------


async def test_redaction_leaves_no_match_in_the_file(
    pool: asyncpg.Pool, dsn: str, exported: Path, other: str
) -> None:
    run_id = read(exported)["run"]["id"]
    patterns = [r"find the \w+", r"echo: \w+", r"\bhi\b", r"6\*7"]
    original = json.dumps(read(exported))
    assert all(re.search(p, original) for p in patterns)
    args = [a for p in patterns for a in ("--redact", p)]
    out = cli(dsn, "runs", "export", run_id, *args).stdout
    assert not [p for p in patterns if re.search(p, out)], "a redacted pattern is in the file"
    doc = json.loads(out)
    assert doc["redacted"] > 0 and "[redacted]" in doc["input"]["text"]
    assert not any(p in out for p in patterns), "the patterns themselves are kept"
    # still a run: it imports and shows
    path = exported.parent / "redacted.json"
    write(path, out)
    ids = json.loads(cli(other, "runs", "import", str(path), "--json").stdout)
    assert json.loads(cli(other, "runs", "show", ids["run_id"], "--json").stdout)["status"]
    bad = cli(dsn, "runs", "export", run_id, "--redact", "(", ok=False)
    assert bad.returncode == 2 and "not a regular expression" in bad.stderr


# -- a run with history before it ----------------------------------------------------


async def test_a_run_with_history_before_it_exports_replays_and_imports(
    pool: asyncpg.Pool, dsn: str, other: str, tmp_path: Path
) -> None:
    """The second run of a session: its file starts from the first run's messages, the
    script's first turn is a placeholder, and imported, the run starts where it did."""
    await make_agent(pool, tools=["calculator"])
    script = [
        {"text": "Hello."},
        {"tool_calls": [call("calculator", expression="6*7")]},
        {"text": "It is 42."},
    ]
    first = await enqueue(pool, "hi")
    await run_until_idle(dsn, scripted(*script))
    session = (await details(pool, first))["session_id"]
    second = await enqueue(pool, "what is 6*7?", session_id=session)
    await run_until_idle(dsn, scripted(*script))
    assert (await details(pool, second))["status"] == "succeeded"
    path = tmp_path / "second.json"
    cli(dsn, "runs", "export", second, "--output", str(path))
    run = load_export(path)
    assert [m.text() for m in run.state().messages] == ["hi", "Hello.", "what is 6*7?"]
    outcome, state, _ = await run_agent(
        run.agent(), ScriptedProvider(run.script()), tools=run.tools(), state=run.state()
    )
    assert outcome.status == "succeeded" and state.messages[-1].text() == "It is 42."
    assert transcript(state.messages) == run.transcript
    ids = json.loads(cli(other, "runs", "import", str(path), "--json").stdout)
    other_pool = await db.create_pool(other, min_size=1, max_size=4)
    try:
        report = await do_replay(other_pool, other, ids["run_id"])
        assert report.identical and report.requests == 2, report.divergence
        runs = await other_pool.fetchval("SELECT count(*) FROM runs")
        assert runs == 2  # the run, and the history before it as a run of its own
    finally:
        await other_pool.close()


async def test_a_run_exported_before_it_finished_imports_cancelled(
    pool: asyncpg.Pool, dsn: str, other: str, tmp_path: Path
) -> None:
    await make_agent(pool, tools=[])
    queued = await enqueue(pool, "not yet")
    path = tmp_path / "queued.json"
    cli(dsn, "runs", "export", queued, "--output", str(path))
    assert read(path)["run"]["status"] == "queued"
    ids = json.loads(cli(other, "runs", "import", str(path), "--json").stdout)
    shown = json.loads(cli(other, "runs", "show", ids["run_id"], "--json").stdout)
    assert shown["status"] == "cancelled" and "exported while queued" in json.dumps(shown)


async def test_stored_blocks_travel_in_the_file_and_are_stored_again_on_import(
    pool: asyncpg.Pool, dsn: str, other: str, tmp_path: Path
) -> None:
    """An image given as input is stored once (blobs): the file carries its bytes, the
    fixture sends them, and an import stores them again, so replay there reads them."""
    picture = png()
    await make_agent(pool, tools=[])
    r = await Client(pool).enqueue("agent", "look", content=[image(picture)])
    await run_until_idle(dsn, scripted({"text": "A picture."}))
    assert (await details(pool, r.run_id))["status"] == "succeeded"
    path = tmp_path / "image.json"
    cli(dsn, "runs", "export", r.run_id, "--output", str(path))
    doc = read(path)
    stored = doc["messages"][0]["content"][0]["source"]
    assert "hango_blob" in stored and "data" not in stored  # the history as stored
    assert [base64.b64decode(b["data"]) for b in doc["blobs"].values()] == [picture]
    run = load_export(path)
    sent = run.state().messages[0].to_dict()
    assert sent["content"][0]["source"]["data"] == base64.b64encode(picture).decode()
    strict = run.provider()
    outcome, _, _ = await run_agent(run.agent(), strict, state=run.state())
    assert outcome.status == "succeeded" and strict.divergence is None
    ids = json.loads(cli(other, "runs", "import", str(path), "--json").stdout)
    other_pool = await db.create_pool(other, min_size=1, max_size=4)
    try:
        report = await do_replay(other_pool, other, ids["run_id"])
        assert report.identical, report.divergence
        data = await other_pool.fetchval("SELECT data FROM blobs")
        assert bytes(data) == picture
    finally:
        await other_pool.close()
