"""Files API ids of stored content blocks (blob_files, migration 0019;
docs/inputs-and-outputs.md "Files API"): by tenant, sha256 and account (a digest of the
endpoint and API key the file was uploaded with)."""

from __future__ import annotations

import asyncpg

LOAD_BLOB_FILES = """
SELECT sha256, file_id FROM blob_files
WHERE tenant_id = $1::uuid AND account = $2 AND sha256 = ANY($3::bytea[])
"""

# The blob row is there (the block was stored once before it could be sent); an upload
# after another worker's wins (the newest id is the one the API has last seen).
SAVE_BLOB_FILE = """
INSERT INTO blob_files (tenant_id, sha256, account, file_id)
VALUES ($1::uuid, $2, $3, $4)
ON CONFLICT (tenant_id, sha256, account)
DO UPDATE SET file_id = EXCLUDED.file_id, uploaded_at = now()
"""


async def load_file_ids(
    db: asyncpg.Pool | asyncpg.Connection, tenant_id: str, account: str, sha256s: list[str]
) -> dict[str, str]:
    """{sha256 (hex): file id} of the blocks uploaded with `account`."""
    rows = await db.fetch(LOAD_BLOB_FILES, tenant_id, account, [bytes.fromhex(s) for s in sha256s])
    return {bytes(r["sha256"]).hex(): str(r["file_id"]) for r in rows}


async def save_file_id(
    db: asyncpg.Pool | asyncpg.Connection, tenant_id: str, account: str, sha256: str, file_id: str
) -> None:
    await db.execute(SAVE_BLOB_FILE, tenant_id, bytes.fromhex(sha256), account, file_id)
