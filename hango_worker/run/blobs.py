"""Content blocks as run input, and blocks stored once (docs/inputs-and-outputs.md).

`input_message` turns a run's input (`{"text"}`, `{"content": [blocks]}` or both) into
its first user message. `inline_blobs` reads, once per run attempt, the bytes of every
stored block in the history (`blobs`, by tenant and sha256) and sets each such block's
`wire` form (the base64 encoded once); the block keeps its reference in `data`, which
is what checkpoints store (`Message.stored_content`). Nothing per turn.
"""

from __future__ import annotations

import base64
from typing import Any

import asyncpg

from hango_worker.provider.content import blob_ref, inline
from hango_worker.provider.types import Block, Message, RawBlock, TextBlock, block_from_dict
from hango_worker.telemetry.metrics import BLOB_BYTES_LOADED, BLOBS_LOADED

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
        blocks = [block_from_dict(b) for b in content]
    if isinstance(text, str) and text:
        blocks.append(TextBlock(text=text))
    elif content is None:
        raise ValueError("runs.input must be an object with a non-empty 'text' or 'content'")
    return Message("user", blocks)


def _refs(messages: list[Message]) -> dict[str, list[RawBlock]]:
    refs: dict[str, list[RawBlock]] = {}
    for m in messages:
        for b in m.content:
            if type(b) is RawBlock:
                ref = blob_ref(b.data)
                if ref is not None:
                    refs.setdefault(ref, []).append(b)
    return refs


async def inline_blobs(db: asyncpg.Pool, tenant_id: str, messages: list[Message]) -> int:
    """Set the wire form of every stored block in `messages`; how many blobs were read.
    ValueError naming the first whose bytes are gone."""
    refs = _refs(messages)
    if not refs:
        return 0
    rows = await db.fetch(LOAD_BLOBS, tenant_id, [bytes.fromhex(r) for r in refs])
    found = {bytes(r["sha256"]).hex(): bytes(r["data"]) for r in rows}
    for ref, blocks in refs.items():
        data = found.get(ref)
        if data is None:
            kind = blocks[0].type
            raise ValueError(f"the bytes of a stored {kind} block are gone (sha256 {ref})")
        b64 = base64.b64encode(data).decode("ascii")
        for b in blocks:
            b.wire = inline(b.data, b64)
        BLOB_BYTES_LOADED.inc(len(data))
    BLOBS_LOADED.inc(len(refs))
    return len(refs)
