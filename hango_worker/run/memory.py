"""PgMemoryStore: the memory port on Postgres (agent/ports.py MemoryStore).

Reads are plain queries. Each write is one statement (store/sql.py MEMORY_*)
fenced by the run's lease — the same condition as every other write of the run,
which it also renews — and conditioned on the file's version. A fenced write
marks the run's PgRunIO as lost, so the run's next write raises Fenced and the
worker stops it, having written nothing.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from hango_worker.agent.ports import MemoryEntry, MemoryFile, MemoryScope, MemoryWrite, WriteContext
from hango_worker.run.io import PgRunIO
from hango_worker.store import sql


def _size(content: str) -> int:
    return len(content.encode("utf-8", errors="replace"))


class PgMemoryStore:
    def __init__(self, pool: asyncpg.Pool, io: PgRunIO) -> None:
        self.pool = pool
        self.io = io

    @staticmethod
    def _key(scope: MemoryScope) -> tuple[str, str, str, str]:
        return (scope.tenant_id, scope.agent_id, scope.kind, scope.key)

    async def index(self, scope: MemoryScope, prefix: str, limit: int) -> list[MemoryEntry]:
        rows = await self.pool.fetch(sql.MEMORY_INDEX, *self._key(scope), prefix, limit)
        return [MemoryEntry(r["path"], int(r["size"]), int(r["version"])) for r in rows]

    async def read(self, scope: MemoryScope, path: str) -> MemoryFile | None:
        row = await self.pool.fetchrow(sql.MEMORY_READ, *self._key(scope), path)
        return None if row is None else MemoryFile(row["content"], int(row["version"]))

    async def files_among(self, scope: MemoryScope, paths: list[str]) -> list[str]:
        rows = await self.pool.fetch(sql.MEMORY_FILES_AMONG, *self._key(scope), paths)
        return [r["path"] for r in rows]

    async def _write(self, query: str, scope: MemoryScope, path: str, *args: Any) -> MemoryWrite:
        io = self.io
        if io.control.lost:
            return MemoryWrite(None, None, fenced=True)
        fence = (io.claim.run_id, io.worker_id, io.claim.attempt, io.lease_s)
        try:
            row = await self.pool.fetchrow(query, *fence, *self._key(scope), path, *args)
        except asyncpg.UniqueViolationError:  # a rename onto a path that exists
            return MemoryWrite(None, None, exists=True)
        assert row is not None
        if int(row["fenced"]) == 0:
            io.control.lost = True
            return MemoryWrite(None, None, fenced=True)
        if row["cancel"]:
            io.control.cancel.set()
        written = row["written"]
        current = row["current"]
        return MemoryWrite(
            None if written is None else int(written), None if current is None else int(current)
        )

    async def create(
        self, scope: MemoryScope, path: str, content: str, by: WriteContext
    ) -> MemoryWrite:
        return await self._write(
            sql.MEMORY_CREATE, scope, path, content, _size(content), by.tool_use_id
        )

    async def update(
        self,
        scope: MemoryScope,
        path: str,
        content: str,
        expected: int,
        by: WriteContext,
        new_path: str | None = None,
    ) -> MemoryWrite:
        return await self._write(
            sql.MEMORY_UPDATE,
            scope,
            path,
            new_path or path,
            content,
            _size(content),
            expected,
            by.tool_use_id,
        )

    async def delete(
        self, scope: MemoryScope, path: str, expected: int, by: WriteContext
    ) -> MemoryWrite:
        return await self._write(sql.MEMORY_DELETE, scope, path, expected)
