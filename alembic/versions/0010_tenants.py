"""Tenants on one fleet: priorities, weights, max_running, fleet-wide model rate limits.

Revision ID: 0010_tenants
Revises: 0009_producer_api

- tenants.weight (1-1000, default 1): the tenant's share of each claim (fair claiming).
- tenants.max_running, agents.max_running (NULL: no limit): how many of the tenant's
  (the agent's) runs may be running at once, fleet-wide; enforced by the claim.
- runs.priority (0-1000, default 0): within a tenant, higher priority is claimed first.
- runs_tenant_queue_idx (tenant, priority desc, created_at) over queued runs: the claim
  reads each tenant's head of queue from it; runs_tenant_running_idx (tenant, agent)
  over running runs: the claim counts a limited tenant's (agent's) running runs.
- hango_claim_slots(tenant, agent, limit): the free slots of a limited tenant (agent),
  counted in a fresh snapshot under a transaction-level advisory lock (the claim's
  serialization per tenant/agent; docs/operations.md "Tenants, fairness and limits").
- rate_limits: one token bucket per provider key / model, shared by every worker.

Additive: code at 0009_producer_api never reads what this adds. Downgrading drops it.
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_tenants"
down_revision = "0009_producer_api"
branch_labels = None
depends_on = None
serves_code_since = "0009_producer_api"

# Free claim slots of a tenant (agent = NULL) or of one agent, under `lim`. VOLATILE
# plpgsql: its count runs in a snapshot taken after the lock, so it sees every claim
# committed before (the calling statement's own snapshot is older). A lock another
# claimer holds means "that claimer is deciding for this tenant now": 0 slots, skip it
# (no waiting, no deadlock between claimers locking tenants in different orders).
CLAIM_SLOTS = """
CREATE FUNCTION hango_claim_slots(t uuid, a uuid, lim int) RETURNS int
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF lim IS NULL THEN
        RETURN 2147483647;
    END IF;
    IF NOT pg_try_advisory_xact_lock(1751084655, hashtext(coalesce(a, t)::text)) THEN
        RETURN 0;
    END IF;
    RETURN greatest(lim - (SELECT count(*) FROM runs r WHERE r.tenant_id = t
        AND (a IS NULL OR r.agent_id = a) AND r.status = 'running'), 0)::int;
END
$$
"""


def upgrade() -> None:
    op.add_column("tenants", sa.Column("weight", sa.Integer, nullable=False, server_default="1"))
    op.add_column("tenants", sa.Column("max_running", sa.Integer))
    op.create_check_constraint("tenants_weight_check", "tenants", "weight BETWEEN 1 AND 1000")
    op.create_check_constraint("tenants_max_running_check", "tenants", "max_running >= 0")
    op.add_column("agents", sa.Column("max_running", sa.Integer))
    op.create_check_constraint("agents_max_running_check", "agents", "max_running >= 0")
    op.add_column("runs", sa.Column("priority", sa.Integer, nullable=False, server_default="0"))
    op.create_check_constraint("runs_priority_check", "runs", "priority BETWEEN 0 AND 1000")
    op.create_index(
        "runs_tenant_queue_idx",
        "runs",
        ["tenant_id", sa.text("priority DESC"), "created_at"],
        postgresql_where=sa.text("status = 'queued'"),
    )
    op.create_index(
        "runs_tenant_running_idx",
        "runs",
        ["tenant_id", "agent_id"],
        postgresql_where=sa.text("status = 'running'"),
    )
    op.create_table(
        "rate_limits",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("requests_per_minute", sa.Integer),
        sa.Column("input_tokens_per_minute", sa.Integer),
        sa.Column("output_tokens_per_minute", sa.Integer),
        sa.Column("window_s", sa.Float, nullable=False, server_default="60"),
        sa.Column("requests", sa.Float, nullable=False, server_default="0"),
        sa.Column("input_tokens", sa.Float, nullable=False, server_default="0"),
        sa.Column("output_tokens", sa.Float, nullable=False, server_default="0"),
        sa.Column(
            "refilled_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("blocked_until", sa.DateTime(timezone=True)),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint(
            "requests_per_minute > 0 AND input_tokens_per_minute > 0 "
            "AND output_tokens_per_minute > 0 AND window_s > 0",
            name="rate_limits_positive_check",
        ),
    )
    op.execute(CLAIM_SLOTS)


def downgrade() -> None:
    op.execute("DROP FUNCTION hango_claim_slots(uuid, uuid, int)")
    op.drop_table("rate_limits")
    op.drop_index("runs_tenant_running_idx", table_name="runs")
    op.drop_index("runs_tenant_queue_idx", table_name="runs")
    op.drop_constraint("runs_priority_check", "runs")
    op.drop_column("runs", "priority")
    op.drop_constraint("agents_max_running_check", "agents")
    op.drop_column("agents", "max_running")
    op.drop_constraint("tenants_max_running_check", "tenants")
    op.drop_constraint("tenants_weight_check", "tenants")
    op.drop_column("tenants", "max_running")
    op.drop_column("tenants", "weight")
