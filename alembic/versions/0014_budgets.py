"""Spend budgets: USD per tenant or agent, per UTC day or month, shared by every worker.

Revision ID: 0014_budgets
Revises: 0013_nesting_and_agent_ids

- budgets: one row per (tenant, agent or none, period): the limit, what to do when it is
  spent (`on_exhausted`: wait | fail), the current window's start, what it spent and what
  calls in flight hold (`reserved_usd`). Unique per scope and period
  (`budgets_scope_idx`, the agent as the nil UUID for a tenant-wide budget); the limit and
  the levels finite and not negative (`budgets_limit_check`, `budgets_levels_check`).
- budget_holds: one row per model call in flight under a budget (its run, attempt,
  budgets and worst-case amount); deleted when the call settles, or by the sweep once
  the attempt no longer runs (docs/operations.md "Spend budgets").

Additive: two new tables, no lock on an existing one beyond the foreign keys' brief
SHARE ROW EXCLUSIVE on tenants and agents. Code at 0012 never reads them. Downgrading
re-queues the runs waiting for a budget (older code would never wake them), then drops
both tables.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0014_budgets"
down_revision = "0013_nesting_and_agent_ids"
branch_labels = None
depends_on = None
serves_code_since = "0009_producer_api"


def upgrade() -> None:
    op.create_table(
        "budgets",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column(
            "tenant_id",
            pg.UUID(as_uuid=False),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "agent_id", pg.UUID(as_uuid=False), sa.ForeignKey("agents.id", ondelete="CASCADE")
        ),
        sa.Column("period", sa.Text, nullable=False),
        sa.Column("limit_usd", sa.Float, nullable=False),
        sa.Column("on_exhausted", sa.Text, nullable=False, server_default="wait"),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("spent_usd", sa.Float, nullable=False, server_default="0"),
        sa.Column("reserved_usd", sa.Float, nullable=False, server_default="0"),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint("period IN ('day', 'month')", name="budgets_period_check"),
        sa.CheckConstraint("on_exhausted IN ('wait', 'fail')", name="budgets_on_exhausted_check"),
        sa.CheckConstraint(
            "limit_usd >= 0 AND limit_usd < 'Infinity'::float8", name="budgets_limit_check"
        ),
        sa.CheckConstraint(
            "spent_usd >= 0 AND spent_usd < 'Infinity'::float8 "
            "AND reserved_usd >= 0 AND reserved_usd < 'Infinity'::float8",
            name="budgets_levels_check",
        ),
    )
    op.create_index(
        "budgets_scope_idx",
        "budgets",
        [
            "tenant_id",
            sa.text("coalesce(agent_id, '00000000-0000-0000-0000-000000000000'::uuid)"),
            "period",
        ],
        unique=True,
    )
    op.create_table(
        "budget_holds",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("run_id", pg.UUID(as_uuid=False), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("budget_ids", pg.ARRAY(sa.BigInteger), nullable=False),
        sa.Column("amount_usd", sa.Float, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )


def downgrade() -> None:
    op.execute(
        "UPDATE runs SET status = 'queued', queued_at = now(), waiting_for = NULL "
        "WHERE status = 'waiting' AND waiting_for->>'reason' = 'budget'"
    )
    op.drop_table("budget_holds")
    op.drop_index("budgets_scope_idx", table_name="budgets")
    op.drop_table("budgets")
