"""Subagents as child runs, and skills: runs.parent_run_id / parent_tool_use_id / depth, skills.

Revision ID: 0008_subagents_skills
Revises: 0007_run_states

- runs.parent_run_id, runs.parent_tool_use_id: a child run and the `task` call that
  made it; unique together, so a parent that crashes and calls again never gets a
  second child for one call. runs.depth: 0 for a run a producer enqueued.
- skills: Agent Skills (SKILL.md + files) registered per tenant, versioned.

Additive: code at 0007 never reads them. Downgrading drops them.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0008_subagents_skills"
down_revision = "0007_run_states"
branch_labels = None
depends_on = None
serves_code_since = "0007_run_states"


def upgrade() -> None:
    op.add_column(
        "runs",
        sa.Column(
            "parent_run_id",
            pg.UUID(as_uuid=False),
            sa.ForeignKey("runs.id", ondelete="SET NULL"),
        ),
    )
    op.add_column("runs", sa.Column("parent_tool_use_id", sa.Text))
    op.add_column("runs", sa.Column("depth", sa.Integer, nullable=False, server_default="0"))
    op.create_index(
        "runs_parent_call_idx",
        "runs",
        ["parent_run_id", "parent_tool_use_id"],
        unique=True,
        postgresql_where=sa.text("parent_run_id IS NOT NULL"),
    )
    op.create_table(
        "skills",
        sa.Column(
            "tenant_id", pg.UUID(as_uuid=False), sa.ForeignKey("tenants.id"), primary_key=True
        ),
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("files", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )


def downgrade() -> None:
    op.drop_table("skills")
    op.drop_index("runs_parent_call_idx", table_name="runs")
    op.drop_column("runs", "depth")
    op.drop_column("runs", "parent_tool_use_id")
    op.drop_column("runs", "parent_run_id")
