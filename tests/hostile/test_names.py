"""Names and ids never mix: no tenant or agent is named like a UUID, and an argument
shaped like a UUID is always read as an id (migration 0012, store/repo.py)."""

from __future__ import annotations

import subprocess
import sys

import asyncpg
import pytest

from hango_worker.client import Client
from hango_worker.store import repo, tenants
from tests.tenant_helpers import tenant_with_agent


async def test_a_uuid_shaped_name_is_refused_everywhere(pool: asyncpg.Pool, dsn: str) -> None:
    """Proves: the store, the Client and the table itself refuse such a name."""
    victim = await tenant_with_agent(pool, "victim")
    with pytest.raises(ValueError, match="may not look like a UUID"):
        await tenants.create_tenant(pool, victim)
    with pytest.raises(ValueError, match="may not look like a UUID"):
        await repo.create_agent(
            pool, tenant_id=victim, name=victim, model="m", system=[], tools=[], config={}
        )
    async with Client.connect(dsn) as client:
        with pytest.raises(ValueError, match="may not look like a UUID"):
            await client.create_agent(victim.upper(), "m")
    with pytest.raises(asyncpg.CheckViolationError, match="tenants_name_not_uuid"):
        await pool.execute("INSERT INTO tenants (id, name) VALUES (gen_random_uuid(), $1)", victim)


@pytest.mark.parametrize(
    "command", [["tenants", "create"], ["agents", "create", "--model", "m", "--name"]]
)
def test_the_cli_refuses_it_with_one_line(command: list[str]) -> None:
    name = "0d1b2f3a-0000-4000-8000-00000000abcd"
    p = subprocess.run(
        [sys.executable, "-m", "hango_worker.cli", *command, name],
        capture_output=True,
        text=True,
        timeout=60,
        env={"HANGO_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none", "PATH": ""},
    )
    assert p.returncode == 2, p.stderr
    assert "looks like a UUID" in p.stderr and "Traceback" not in p.stderr


async def test_an_impostor_named_like_a_tenants_id_takes_nothing_over(
    pool: asyncpg.Pool,
) -> None:
    """Proves: a tenant named like another's id (one made before the check, or with it
    off) no longer captures what names that id: SQL API and store read it as an id."""
    victim = await tenant_with_agent(pool, "victim")
    await pool.execute("ALTER TABLE tenants DROP CONSTRAINT tenants_name_not_uuid")
    impostor = await pool.fetchval(
        "INSERT INTO tenants (id, name) VALUES (gen_random_uuid(), $1) RETURNING id::text",
        victim,
    )
    await repo.create_agent(
        pool, tenant_id=impostor, name="agent", model="m", system=[], tools=[], config={}
    )
    assert await tenants.resolve_tenant(pool, victim) == victim
    await pool.execute(
        "SELECT hango_api.enqueue('agent', '{\"text\": \"hi\"}', tenant => $1)", victim
    )
    owner = await pool.fetchval("SELECT tenant_id::text FROM runs")
    assert owner == victim, "the impostor took the enqueue"
    assert await tenants.resolve_tenant(pool, "victim") == victim  # names still work
