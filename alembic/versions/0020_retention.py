"""Retention policies (docs/operations.md "Retention policies").

Revision ID: 0020_retention
Revises: 0019_blob_files

- retention: how long a tenant's finished runs, their events and files, runless
  sessions and unused memories are kept.

`retention` holds one row per scope: the fleet default (tenant_id and agent_id NULL),
a tenant's policy (agent_id NULL) or an agent's override. Each duration is in seconds;
NULL falls through to the wider scope (agent, then tenant, then fleet), and NULL at
every scope keeps that kind forever. The workers enforce the policies
(run/retention.py, store/retention.py).

Additive: a new table that code before this revision never reads. Downgrading drops it.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0020_retention"
down_revision = "0019_blob_files"
branch_labels = None
depends_on = None
serves_code_since = "0009_producer_api"

KINDS = ("runs", "events", "files", "sessions", "memories")


def upgrade() -> None:
    op.create_table(
        "retention",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column(
            "tenant_id",
            pg.UUID(as_uuid=False),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
        ),
        sa.Column(
            "agent_id", pg.UUID(as_uuid=False), sa.ForeignKey("agents.id", ondelete="CASCADE")
        ),
        *(sa.Column(f"{k}_s", sa.BigInteger) for k in KINDS),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint(
            " AND ".join(f"({k}_s IS NULL OR {k}_s >= 0)" for k in KINDS),
            name="retention_durations_check",
        ),
        sa.CheckConstraint(
            "agent_id IS NULL OR tenant_id IS NOT NULL", name="retention_agent_tenant_check"
        ),
    )
    op.create_index(
        "retention_scope_idx",
        "retention",
        [
            sa.text("coalesce(tenant_id, '00000000-0000-0000-0000-000000000000'::uuid)"),
            sa.text("coalesce(agent_id, '00000000-0000-0000-0000-000000000000'::uuid)"),
        ],
        unique=True,
    )


def downgrade() -> None:
    op.drop_index("retention_scope_idx", table_name="retention")
    op.drop_table("retention")
