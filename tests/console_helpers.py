"""The run console on a real uvicorn (127.0.0.1, an ephemeral port) for the tests,
with three tokens: one that may act, one read-only, one of another tenant."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from hango_worker.console import server
from hango_worker.store import repo
from tests.helpers import call, recording_tool, scripted
from tests.worker_helpers import enqueue, make_agent, run_until_idle, settings

ACT = "act-token-" + "a" * 30
READ = "read-token-" + "r" * 30
OTHER = "other-token-" + "o" * 30
OTHER_TENANT = "00000000-0000-0000-0000-0000000000aa"
TOKENS: dict[str, Any] = {
    ACT: {"role": "act", "name": "alice"},
    READ: {"role": "read", "name": "reader"},
    OTHER: {"role": "act", "name": "mallory", "tenants": [OTHER_TENANT]},
}
GATED = {"approvals": [{"tool": "echo"}]}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def console(dsn: str, **over: Any) -> AsyncIterator[str]:
    """The console's base URL while the block runs."""
    over.setdefault("console_tokens", TOKENS)
    async with server.running(settings(dsn, console_port=0, **over), dsn) as r:
        yield r.url


async def other_tenant_run(pool: asyncpg.Pool) -> str:
    await pool.execute(
        "INSERT INTO tenants (id, name) VALUES ($1, 'other') ON CONFLICT DO NOTHING", OTHER_TENANT
    )
    await repo.create_agent(
        pool, tenant_id=OTHER_TENANT, name="theirs", model="m", system=[], tools=[], config={}
    )
    ids = await repo.enqueue(pool, tenant_id=OTHER_TENANT, agent="theirs", input_text="secret")
    return ids["run_id"]


async def waiting_runs(pool: asyncpg.Pool, dsn: str, n: int = 1) -> list[str]:
    """`n` runs of a gated agent, each waiting for the approval of an `echo` call."""
    await make_agent(pool, name="gated", tools=["echo"], config=GATED)
    ids = [await enqueue(pool, "echo something", agent="gated") for _ in range(n)]
    tool, _ = recording_tool()
    turns = scripted({"tool_calls": [call("echo", text="hi")]}, {"text": "all done"})
    await run_until_idle(dsn, turns, tools=[tool])
    return ids


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, "no CSRF field on the page"
    return found.group(1)
