"""Files API ids of stored content blocks (docs/inputs-and-outputs.md, "Files API").

Revision ID: 0019_blob_files
Revises: 0018_handed_back

- blob_files (tenant, sha256, account → file_id, uploaded_at): the Files API file a
  stored block (`blobs`) was uploaded as, for an agent with `files_api: true`. `account`
  is a digest of the API endpoint and key the file was uploaded with (a file belongs to
  the workspace of the key that uploaded it); the secret itself is never stored. A row
  goes with its blob (ON DELETE CASCADE: store/gc.py deleting a blob deletes its ids).

Additive: a new table that code before this revision never reads. Downgrading drops it.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0019_blob_files"
down_revision = "0018_handed_back"
branch_labels = None
depends_on = None
serves_code_since = "0009_producer_api"


def upgrade() -> None:
    op.create_table(
        "blob_files",
        sa.Column("tenant_id", pg.UUID(as_uuid=False), primary_key=True),
        sa.Column("sha256", sa.LargeBinary, primary_key=True),
        sa.Column("account", sa.Text, primary_key=True),
        sa.Column("file_id", sa.Text, nullable=False),
        sa.Column(
            "uploaded_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id", "sha256"],
            ["blobs.tenant_id", "blobs.sha256"],
            name="blob_files_blob_fkey",
            ondelete="CASCADE",
        ),
    )


def downgrade() -> None:
    op.drop_table("blob_files")
