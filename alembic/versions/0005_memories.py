"""Long-term memory: the memories table (files under /memories that outlive runs).

Revision ID: 0005_memories
Revises: 0004_run_files

- memories: one row per (tenant, agent, scope, scope key, path) with an
  optimistic-concurrency `version`; written by the Memory middleware, one fenced
  statement per write (docs/design.md §12), read by `hango-worker memory`.

Additive (a new table): code at 0004 still runs on it. Downgrading drops the
table and every memory in it.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0005_memories"
down_revision = "0004_run_files"
branch_labels = None
depends_on = None
# additive only (a new table): code at 0004 still runs on it
serves_code_since = "0004_run_files"


def upgrade() -> None:
    op.create_table(
        "memories",
        sa.Column(
            "tenant_id", pg.UUID(as_uuid=False), sa.ForeignKey("tenants.id"), primary_key=True
        ),
        sa.Column("agent_id", pg.UUID(as_uuid=False), sa.ForeignKey("agents.id"), primary_key=True),
        sa.Column("scope", sa.Text, primary_key=True),
        sa.Column("scope_key", sa.Text, primary_key=True),
        sa.Column("path", sa.Text, primary_key=True),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("version", sa.Integer, nullable=False, server_default=sa.text("1")),
        sa.Column("run_id", pg.UUID(as_uuid=False)),
        sa.Column("tool_use_id", sa.Text),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint("scope IN ('agent', 'session', 'key')", name="memories_scope_check"),
    )


def downgrade() -> None:
    op.drop_table("memories")
