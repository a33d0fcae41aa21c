"""Content blocks as run input, and blocks stored once (docs/inputs-and-outputs.md).

`input_message` turns a run's input (`{"text"}`, `{"content": [blocks]}` or both) into
its first user message, its blocks checked against the SDK's types (the SQL API checks
the API's limits only). `inline_blobs` reads, once per run attempt, the bytes of every
stored block in the history (`blobs`, by tenant and sha256) and sets each such block's
`wire` form (the base64 encoded once); the block keeps its reference in `data`, which
is what checkpoints store (`Message.stored_content`). Nothing per turn.
"""

from __future__ import annotations

import base64
from typing import Any

import asyncpg

from hango_worker.provider.content import BLOB_KEY, Blob, blob_ref, check_input_blocks, inline
from hango_worker.provider.types import (
    Block,
    Message,
    RawBlock,
    TextBlock,
    ToolResultBlock,
    block_from_dict,
)
from hango_worker.store.blob_files import load_file_ids, save_file_id
from hango_worker.telemetry.metrics import BLOB_BYTES_LOADED, BLOB_BYTES_STORED, BLOBS_LOADED
from hango_worker.tool.types import ToolResult

LOAD_BLOBS = (
    "SELECT sha256, data FROM blobs WHERE tenant_id = $1::uuid AND sha256 = ANY($2::bytea[])"
)


def input_message(run_input: Any) -> Message:
    """The run's first user message: its content blocks, then its text. ValueError when
    the input holds neither."""
    if not isinstance(run_input, dict):
        raise ValueError("runs.input must be an object with a non-empty 'text' or 'content'")
    text, content = run_input.get("text"), run_input.get("content")
    blocks: list[Block] = []
    if content is not None:
        if not isinstance(content, list) or not content:
            raise ValueError("runs.input.content must be a non-empty list of content blocks")
        check_input_blocks([_as_checked(b) for b in content], "runs.input.content")
        blocks = [block_from_dict(b) for b in content]
    if isinstance(text, str) and text:
        blocks.append(TextBlock(text=text))
    elif content is None:
        raise ValueError("runs.input must be an object with a non-empty 'text' or 'content'")
    return Message("user", blocks)


# A tool result's blobs and the run's references to them, in one statement (the
# reference's foreign key is checked at its end, when the blob row is there).
STORE_BLOBS = """
WITH b AS (
    INSERT INTO blobs (tenant_id, sha256, media_type, size, data)
    SELECT $1::uuid, x.s, x.m, octet_length(x.d), x.d
    FROM unnest($3::bytea[], $4::text[], $5::bytea[]) AS x(s, m, d)
    ON CONFLICT DO NOTHING
)
INSERT INTO run_blobs (run_id, sha256, tenant_id)
SELECT DISTINCT $2::uuid, s, $1::uuid FROM unnest($3::bytea[]) AS s
ON CONFLICT DO NOTHING
"""

Holder = RawBlock | ToolResultBlock


def _as_checked(block: Any) -> Any:
    """A stored block as the SDK's types see it: a reference stands for its data."""
    if isinstance(block, dict) and blob_ref(block) is not None:
        source = {k: v for k, v in block["source"].items() if k not in (BLOB_KEY, "size")}
        return {**block, "source": {**source, "data": ""}}
    return block


def _refs(messages: list[Message]) -> dict[str, list[Holder]]:
    refs: dict[str, list[Holder]] = {}
    for m in messages:
        for b in m.content:
            if type(b) is RawBlock:
                ref = blob_ref(b.data)
                if ref is not None:
                    refs.setdefault(ref, []).append(b)
            elif type(b) is ToolResultBlock and b.blocks is not None:
                for part in b.blocks:
                    ref = blob_ref(part) if isinstance(part, dict) else None
                    if ref is not None:
                        refs.setdefault(ref, []).append(b)
    return refs


async def store_blobs(db: asyncpg.Pool, tenant_id: str, run_id: str, blobs: list[Blob]) -> None:
    """Store a tool result's large blocks once (by sha256) and the run's references."""
    args = [b.sha256 for b in blobs], [b.media_type for b in blobs], [b.data for b in blobs]
    await db.execute(STORE_BLOBS, tenant_id, run_id, *args)
    BLOB_BYTES_STORED.inc(sum(len(b.data) for b in blobs))


async def _fetch(db: asyncpg.Pool, tenant_id: str, refs: list[str]) -> dict[str, str]:
    """{sha256: base64} of the stored blobs; ValueError naming the first one gone."""
    rows = await db.fetch(LOAD_BLOBS, tenant_id, [bytes.fromhex(r) for r in refs])
    found = {bytes(r["sha256"]).hex(): bytes(r["data"]) for r in rows}
    out: dict[str, str] = {}
    for ref in refs:
        data = found.get(ref)
        if data is None:
            raise ValueError(f"the bytes of a stored block are gone (sha256 {ref})")
        out[ref] = base64.b64encode(data).decode("ascii")
        BLOB_BYTES_LOADED.inc(len(data))
    BLOBS_LOADED.inc(len(out))
    return out


def _wire(blocks: list[dict[str, Any]], b64: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for part in blocks:
        ref = blob_ref(part) if isinstance(part, dict) else None
        out.append(part if ref is None else inline(part, b64[ref]))
    return out


async def inline_results(
    db: asyncpg.Pool, tenant_id: str, recorded: dict[str, ToolResult]
) -> dict[str, ToolResult]:
    """The recorded results of a pending turn with their stored blocks' bytes back."""
    refs = {
        ref
        for r in recorded.values()
        for part in r.stored or []
        if isinstance(part, dict) and (ref := blob_ref(part)) is not None
    }
    if not refs:
        return recorded
    b64 = await _fetch(db, tenant_id, sorted(refs))
    out = dict(recorded)
    for key, r in recorded.items():
        if r.stored is not None and any(isinstance(p, dict) and blob_ref(p) for p in r.stored):
            wire = _wire(r.stored, b64)
            out[key] = ToolResult(r.content, r.is_error, r.outcome, blocks=wire)
    return out


async def inline_blobs(db: asyncpg.Pool, tenant_id: str, messages: list[Message]) -> int:
    """Set the wire form of every stored block in `messages`; how many blobs were read.
    ValueError naming the first whose bytes are gone."""
    refs = _refs(messages)
    if not refs:
        return 0
    b64 = await _fetch(db, tenant_id, list(refs))
    for holders in refs.values():
        for b in holders:
            if type(b) is RawBlock:
                ref = blob_ref(b.data)
                assert ref is not None
                b.wire = inline(b.data, b64[ref])
            elif type(b) is ToolResultBlock and b.blocks is not None and b.wire is None:
                b.wire = _wire(b.blocks, b64)
    return len(refs)


class PgFileIds:
    """The Files API ids of a tenant's stored blocks (`blob_files`, provider/files.py
    `FileIds`), read once per run attempt and kept: later calls ask the table only for
    the blocks they have not seen."""

    def __init__(self, db: asyncpg.Pool, tenant_id: str) -> None:
        self.db, self.tenant_id = db, tenant_id
        self._ids: dict[tuple[str, str], str] = {}

    async def load(self, account: str, sha256s: list[str]) -> dict[str, str]:
        out = {s: i for s in sha256s if (i := self._ids.get((account, s))) is not None}
        missing = [s for s in sha256s if s not in out]
        if missing:
            found = await load_file_ids(self.db, self.tenant_id, account, missing)
            self._ids.update({(account, s): i for s, i in found.items()})
            out.update(found)
        return out

    async def save(self, account: str, sha256: str, file_id: str) -> None:
        await save_file_id(self.db, self.tenant_id, account, sha256, file_id)
        self._ids[(account, sha256)] = file_id
