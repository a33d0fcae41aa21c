"""An image block of a run's transcript, as bytes for the run page's thumbnails.

`/runs/{run_id}/images/{seq}/{where}`: `where` is the block's index in message `seq`
(`3`), or, for an image a tool returned, the tool_result block's index and the image's
index in its content (`3.1`). The bytes come from the block itself (inline base64) or,
for a block stored once by reference (docs/inputs-and-outputs.md), from `blobs`, always
within the caller's tenants. Only the image types the API takes are served, each with
its own media type, `nosniff` and a CSP that runs nothing, so a stored block can never
be served as a page.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

import asyncpg

from hango_worker.render import BLOB_KEY
from hango_worker.store import console_queries

IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; sandbox",
    "Cache-Control": "private, max-age=3600",
}


def image_path(run_id: str, seq: Any, where: str) -> str:
    return f"/runs/{run_id}/images/{seq}/{where}"


def _block_at(content: Any, where: str) -> dict[str, Any] | None:
    """The block `where` ("i" or "i.j") names in a message's content, or None."""
    try:
        steps = [int(p) for p in where.split(".")]
    except ValueError:
        return None
    if len(steps) not in (1, 2) or any(s < 0 for s in steps):
        return None
    node: Any = content
    for depth, i in enumerate(steps):
        if depth == 1:
            node = node.get("content") if isinstance(node, dict) else None
        if not isinstance(node, list) or i >= len(node):
            return None
        node = node[i]
    return node if isinstance(node, dict) else None


async def image(
    pool: asyncpg.Pool, tenant_id: str, run_id: str, seq: int, where: str
) -> tuple[bytes, str] | None:
    """(bytes, media type) of the image block, or None when there is none there."""
    raw = await console_queries.message_content(pool, run_id, seq)
    try:
        block = _block_at(json.loads(raw) if raw else None, where)
    except (ValueError, RecursionError):
        return None
    source = block.get("source") if block is not None else None
    if block is None or block.get("type") != "image" or not isinstance(source, dict):
        return None
    media_type = source.get("media_type")
    if media_type not in IMAGE_TYPES:
        return None
    if isinstance(source.get("data"), str) and source.get("type") == "base64":
        try:
            return base64.b64decode(source["data"], validate=True), str(media_type)
        except (binascii.Error, ValueError):
            return None
    ref = source.get(BLOB_KEY)
    if isinstance(ref, str):
        data = await console_queries.blob_bytes(pool, tenant_id, ref)
        return None if data is None else (data, str(media_type))
    return None
