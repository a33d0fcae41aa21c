"""Long runs: run_files (tool results offloaded, files the agent writes) and runs.limit_reached.

Revision ID: 0004_run_files
Revises: 0003_queue_integrity

- run_files: one row per (run, path), written inside the fenced commit of the
  tool result that produced it (docs/design.md §12); removed with its run
  (ON DELETE CASCADE, so `gc` removes it when it removes the run).
- runs.limit_reached: which limit ended the run with a wind-up answer
  (e.g. 'max_turns'); NULL when the run ended on its own.

Both are additive: code at 0003 still runs on this schema. Downgrading drops both.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0004_run_files"
down_revision = "0003_queue_integrity"
branch_labels = None
depends_on = None
# additive only (a new table, a nullable column): code at 0003 still runs on it
serves_code_since = "0003_queue_integrity"


def upgrade() -> None:
    op.create_table(
        "run_files",
        sa.Column(
            "run_id",
            pg.UUID(as_uuid=False),
            sa.ForeignKey("runs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("path", sa.Text, primary_key=True),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("tool_use_id", sa.Text),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    op.add_column("runs", sa.Column("limit_reached", sa.Text))


def downgrade() -> None:
    op.drop_column("runs", "limit_reached")
    op.drop_table("run_files")
