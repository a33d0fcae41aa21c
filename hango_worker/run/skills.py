"""PgSkillStore: the skills port on Postgres (agent/ports.py SkillStore), read only."""

from __future__ import annotations

import asyncpg

from hango_worker.agent.ports import Skill
from hango_worker.store import sql


class PgSkillStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def latest(self, tenant_id: str, names: list[str]) -> list[Skill]:
        rows = await self.pool.fetch(sql.SKILLS_LATEST, tenant_id, names)
        return [
            Skill(r["name"], int(r["version"]), r["description"], r["body"], dict(r["files"]))
            for r in rows
        ]
