"""Stored blocks sent as Files API files (docs/inputs-and-outputs.md, "Files API").

For a request of an agent with `files_api: true` (`Request.files` set), every image or
document stored once (`source.hango_blob`, provider/content.py) is sent as
`{"type": "file", "file_id": …}` instead of its base64: its bytes are uploaded once per
account (a digest of the endpoint and key: a file belongs to the key's workspace), the
id kept by `Request.files` (the `blob_files` table) and reused by later calls and runs.
The request then carries the `files-api-2025-04-14` beta. A call the API refuses naming
one of the files sent (it no longer has it) is answered by uploading those again and
calling once more (provider/anthropic.py).

`hango_files_uploaded_total{outcome}` counts each stored block a request sends as a file:
`uploaded` (first time), `reused` (an id kept before), `reuploaded` (the API had lost
it); a call that uploads adds the event `model.files_uploaded` to the current (`chat`) span.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, replace
from typing import Any

import anthropic
from opentelemetry.trace import get_current_span

from hango_worker.provider.content import blob_ref
from hango_worker.provider.types import (
    JSON,
    Block,
    FileIds,
    Message,
    ModelError,
    RawBlock,
    Request,
    ToolResultBlock,
)
from hango_worker.telemetry.metrics import FILES_UPLOADED

FILES_BETA = "files-api-2025-04-14"
_EXTENSIONS = {
    "application/pdf": ".pdf",
    "image/png": ".png",
    "image/jpeg": ".jpg",
    "image/gif": ".gif",
    "image/webp": ".webp",
}


@dataclass(slots=True)
class StoredBlob:
    """A stored block of a request: its media type and its bytes as sent (base64)."""

    media_type: str
    b64: str


def account_of(client: anthropic.AsyncAnthropic) -> str:
    """A digest of the endpoint and credential files are uploaded with (never the key)."""
    key = client.api_key or client.auth_token or ""
    return hashlib.sha256(f"{client.base_url}\n{key}".encode()).hexdigest()[:32]


def _b64(wire: Any) -> str | None:
    source = wire.get("source") if isinstance(wire, dict) else None
    if not isinstance(source, dict) or source.get("type") != "base64":
        return None
    data = source.get("data")
    return data if isinstance(data, str) else None


def _add(out: dict[str, StoredBlob], stored: Any, wire: Any) -> None:
    ref = blob_ref(stored) if isinstance(stored, dict) else None
    b64 = _b64(wire)
    if ref is not None and b64 is not None and ref not in out:
        out[ref] = StoredBlob(str(stored["source"].get("media_type", "")), b64)


def stored_blobs(messages: list[Message]) -> dict[str, StoredBlob]:
    """{sha256: blob} of every stored block in `messages` whose bytes are loaded."""
    out: dict[str, StoredBlob] = {}
    for m in messages:
        for b in m.content:
            if type(b) is RawBlock and b.wire is not None:
                _add(out, b.data, b.wire)
            elif type(b) is ToolResultBlock and b.blocks is not None and b.wire is not None:
                for part, wire in zip(b.blocks, b.wire, strict=False):
                    _add(out, part, wire)
    return out


def file_block(block: dict[str, JSON], file_id: str) -> dict[str, JSON]:
    """The stored block as sent through the Files API: its source is the file."""
    return {**block, "source": {"type": "file", "file_id": file_id}}


def _block(b: Block, ids: dict[str, str]) -> Block:
    if type(b) is RawBlock and b.wire is not None:
        ref = blob_ref(b.data)
        return RawBlock(b.data, file_block(b.data, ids[ref])) if ref in ids else b
    if type(b) is ToolResultBlock and b.blocks is not None and b.wire is not None:
        wire: list[dict[str, JSON]] = []
        for part, sent in zip(b.blocks, b.wire, strict=False):
            ref = blob_ref(part) if isinstance(part, dict) else None
            wire.append(file_block(part, ids[ref]) if ref in ids else sent)
        return replace(b, wire=wire)
    return b


def with_file_ids(request: Request, ids: dict[str, str]) -> Request:
    """The request with each stored block of `ids` sent as its file, and the beta on."""
    messages = [Message(m.role, [_block(b, ids) for b in m.content]) for m in request.messages]
    params: dict[str, JSON] = dict(request.params or {})
    betas = params.get("betas")
    betas = list(betas) if isinstance(betas, list) else []
    params["betas"] = betas if FILES_BETA in betas else [*betas, FILES_BETA]
    return replace(request, messages=messages, params=params, files=None)


def vanished(error: ModelError, ids: dict[str, str]) -> set[str]:
    """The sha256s whose file a refused call names (the API no longer has them)."""
    if error.status not in (400, 404):
        return set()
    return {sha for sha, file_id in ids.items() if file_id in error.message}


class FileUploads:
    """Uploads a provider's stored blocks once and finds the ids kept before."""

    def __init__(self, client: anthropic.AsyncAnthropic) -> None:
        self.client = client
        self.account = account_of(client)

    async def resolve(
        self, files: FileIds, blobs: dict[str, StoredBlob], gone: set[str] | None = None
    ) -> dict[str, str]:
        """{sha256: file id} for every blob: kept ones (but `gone`), the rest uploaded."""
        gone = gone or set()
        known = await files.load(self.account, [s for s in blobs if s not in gone])
        ids: dict[str, str] = {}
        uploaded = {"uploaded": 0, "reuploaded": 0}
        for sha, blob in blobs.items():
            if sha in known and sha not in gone:
                ids[sha] = known[sha]
                FILES_UPLOADED.labels(outcome="reused").inc()
                continue
            ids[sha] = await self._upload(sha, blob)
            await files.save(self.account, sha, ids[sha])
            outcome = "reuploaded" if sha in gone else "uploaded"
            uploaded[outcome] += 1
            FILES_UPLOADED.labels(outcome=outcome).inc()
        if any(uploaded.values()):
            get_current_span().add_event(
                "model.files_uploaded",
                {f"hango.files.{k}": v for k, v in uploaded.items()},
            )
        return ids

    async def _upload(self, sha: str, blob: StoredBlob) -> str:
        name = sha[:16] + _EXTENSIONS.get(blob.media_type, "")
        raw = base64.b64decode(blob.b64)
        meta = await self.client.beta.files.upload(
            file=(name, raw, blob.media_type), betas=[FILES_BETA]
        )
        return meta.id
