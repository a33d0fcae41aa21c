"""The Python client: enqueue runs and follow them from your own code.

async with Client.connect(dsn) as client:
    ids = await client.enqueue(agent="support", input="Where is my order?")
    run = await client.wait(ids["run_id"])
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from hango_worker.store import db, repo

FINISHED = ("succeeded", "failed", "cancelled")


class Client:
    def __init__(self, pool: asyncpg.Pool, tenant_id: str = repo.DEFAULT_TENANT_ID) -> None:
        self.pool = pool
        self.tenant_id = tenant_id

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, dsn: str, tenant_id: str = repo.DEFAULT_TENANT_ID
    ) -> AsyncIterator[Client]:
        pool = await db.create_pool(dsn, min_size=1, max_size=4)
        try:
            yield cls(pool, tenant_id)
        finally:
            await pool.close()

    async def create_agent(
        self,
        name: str,
        model: str,
        *,
        system: list[str] | None = None,
        tools: list[str] | None = None,
        config: dict[str, Any] | None = None,
    ) -> str:
        from hango_worker.agent.spec import AgentConfig

        cfg = AgentConfig.model_validate(config or {}).model_dump(exclude_none=True)
        await repo.ensure_default_tenant(self.pool)
        return await repo.create_agent(
            self.pool,
            tenant_id=self.tenant_id,
            name=name,
            model=model,
            system=system or [],
            tools=tools or [],
            config=cfg,
        )

    async def enqueue(
        self, agent: str, input: str, session_id: str | None = None
    ) -> dict[str, str]:
        return await repo.enqueue(
            self.pool,
            tenant_id=self.tenant_id,
            agent=agent,
            input_text=input,
            session_id=session_id,
        )

    async def get(self, run_id: str) -> dict[str, Any]:
        return await repo.run_details(self.pool, self.tenant_id, run_id)

    async def cancel(self, run_id: str) -> str:
        return await repo.request_cancel(self.pool, self.tenant_id, run_id)

    async def resume(self, run_id: str) -> None:
        await repo.resume(self.pool, self.tenant_id, run_id)

    async def wait(
        self, run_id: str, timeout_s: float = 300.0, poll_s: float = 0.1
    ) -> dict[str, Any]:
        async with asyncio.timeout(timeout_s):
            while True:
                run = await repo.get_run(self.pool, self.tenant_id, run_id)
                if run["status"] in FINISHED:
                    return await self.get(run_id)
                await asyncio.sleep(poll_s)
