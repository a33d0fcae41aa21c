"""Stored JSON nested deeper than Python decodes (a hand edit, another producer): the
operator's commands read it without a RecursionError or a traceback."""

from __future__ import annotations

import json

import asyncpg

from hango_worker.store import repo
from tests.tenant_helpers import tenant_with_agent
from tests.test_cli import cli

DEEP = "[" * 5_000 + "]" * 5_000  # Postgres stores it; Python's json.loads cannot


async def test_runs_history_on_deeply_nested_content_prints_one_line_per_turn(
    pool: asyncpg.Pool, dsn: str
) -> None:
    """Proves: `runs history` (plain and --json) lists a turn whose stored content is
    nested 5,000 deep, its tool names read in SQL (before: a RecursionError traceback);
    `runs show` shows the message as unreadable, and a name that is not a string is
    shown bounded."""
    await tenant_with_agent(pool, "default")
    run = await repo.enqueue_run(
        pool, tenant_id=repo.DEFAULT_TENANT_ID, agent="agent", input_text="hi"
    )
    content = (
        '[{"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": ' + DEEP + "}},"
        ' {"type": "tool_use", "id": "t2", "name": '
        + '{"n": "'
        + "x" * 1000
        + '"}'
        + ', "input": {}}]'
    )
    await pool.execute(
        "INSERT INTO messages (session_id, seq, run_id, role, content) "
        "VALUES ($1, 1, $2, 'assistant', $3::text::jsonb)",
        run.session_id,
        run.run_id,
        content,
    )
    p = cli(dsn, "runs", "history", run.run_id)
    (line,) = p.stdout.splitlines()
    assert line.split()[0] == "1" and "lookup, " in line and "Traceback" not in p.stderr
    assert len(line) < 400, "a name is shown bounded"
    turns = json.loads(cli(dsn, "runs", "history", run.run_id, "--json").stdout)
    assert turns[0]["tool_calls"][0] == "lookup" and len(turns[0]["tool_calls"][1]) == 200
    shown = cli(dsn, "runs", "show", run.run_id)
    assert "Traceback" not in shown.stderr
