"""Every implementation of the store ports (agent/ports.py), built the same way for the
contract suites: on Postgres (a claimed run of a fresh database) and in memory
(testing/inmem.py). A new implementation of a port is added here, and the suites run
against it too."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import asyncpg

from hango_worker.agent.ports import FileStore, MemoryScope, MemoryStore, RunIO, SkillStore
from hango_worker.agent.state import State
from hango_worker.run.claim import Claim
from hango_worker.run.io import PgRunIO
from hango_worker.run.memory import PgMemoryStore
from hango_worker.run.skills import PgSkillStore
from hango_worker.store import repo, sql
from hango_worker.store import skills as sk
from hango_worker.testing.inmem import InMemoryMemoryStore, InMemorySkillStore, MemoryRunIO
from tests.worker_helpers import make_agent

BACKENDS = ["postgres", "in-memory"]
WORKER = "worker-a"


class RunStore(RunIO, FileStore, Protocol):
    """What the loop and the file tools get for one run: the durability port and the
    reads of the run's files (PgRunIO, MemoryRunIO)."""


@dataclass
class RunCase:
    io: RunStore
    state: State


@dataclass
class MemoryCase:
    """A memory store, a scope in it, another agent of the same tenant, the writing run,
    and `fence()`: that run's worker loses the run (every later write is fenced)."""

    store: MemoryStore
    scope: MemoryScope
    other_agent: str
    run_id: str
    fence: Callable[[], Awaitable[None]]


@dataclass
class SkillCase:
    """A skill store, two tenants, and `add(tenant, name, description, body, files)`,
    which stores a new version of a skill the way the implementation's writer does."""

    store: SkillStore
    tenant: str
    other_tenant: str
    add: Callable[[str, str, str, str, dict[str, str]], Awaitable[int]]


def _state(run_id: str, tenant_id: str, agent_id: str, session_id: str) -> State:
    return State(run_id=run_id, session_id=session_id, agent_id=agent_id, tenant_id=tenant_id)


async def _claim_one(pool: asyncpg.Pool, agent: str) -> Claim:
    await repo.enqueue(pool, tenant_id=repo.DEFAULT_TENANT_ID, agent=agent, input_text="go")
    (row,) = await pool.fetch(sql.CLAIM, WORKER, 1, 30.0)
    return Claim.from_record(row)


async def _pg_io(pool: asyncpg.Pool, agent: str) -> PgRunIO:
    claim = await _claim_one(pool, agent)
    return PgRunIO(
        pool, claim, worker_id=WORKER, lease_s=30.0, next_message_seq=1, next_event_seq=1
    )


class RunCases:
    """New runs, each with its own RunIO, on one backend."""

    def __init__(self, pool: asyncpg.Pool | None) -> None:
        self.pool = pool
        self._agent = ""

    async def new_run(self) -> RunCase:
        if self.pool is None:
            run_id = str(uuid.uuid4())
            return RunCase(MemoryRunIO(), _state(run_id, "tenant-1", "agent-1", run_id))
        if not self._agent:
            self._agent = "files"
            await make_agent(self.pool, name=self._agent, tools=["read_file", "write_file"])
        io = await _pg_io(self.pool, self._agent)
        c = io.claim
        return RunCase(io, _state(c.run_id, c.tenant_id, c.agent_id, c.session_id))


async def memory_case(pool: asyncpg.Pool | None) -> MemoryCase:
    if pool is None:
        store = InMemoryMemoryStore()
        run_id = str(uuid.uuid4())

        async def fence_memory() -> None:
            store.fenced_runs.add(run_id)

        scope = MemoryScope("tenant-1", "agent-1", "agent")
        return MemoryCase(store, scope, "agent-2", run_id, fence_memory)
    await make_agent(pool, name="mem", tools=["memory"])
    await make_agent(pool, name="other", tools=["memory"])
    other = await repo.find_agent(pool, repo.DEFAULT_TENANT_ID, "other")
    io = await _pg_io(pool, "mem")

    async def fence_pg() -> None:  # another worker took the run over
        await pool.execute("UPDATE runs SET lease_owner = 'worker-b', attempt = attempt + 1")

    scope = MemoryScope(io.claim.tenant_id, io.claim.agent_id, "agent")
    return MemoryCase(PgMemoryStore(pool, io), scope, str(other["id"]), io.claim.run_id, fence_pg)


async def skill_case(pool: asyncpg.Pool | None) -> SkillCase:
    if pool is None:
        mem = InMemorySkillStore()

        async def add_mem(t: str, name: str, desc: str, body: str, files: dict[str, str]) -> int:
            return mem.add(t, name, desc, body, files)

        return SkillCase(mem, "tenant-1", "tenant-2", add_mem)
    tenant = await repo.ensure_default_tenant(pool)
    other = str(uuid.uuid4())
    await pool.execute("INSERT INTO tenants (id, name) VALUES ($1, 'second')", other)

    async def add_pg(t: str, name: str, desc: str, body: str, files: dict[str, str]) -> int:
        return await sk.add_skill(pool, t, sk.SkillFolder(name, desc, body, files))

    return SkillCase(PgSkillStore(pool), tenant, other, add_pg)
