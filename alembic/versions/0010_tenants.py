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
- hango_api.enqueue and hango_enqueue_run gain `priority int DEFAULT 0` as their last
  argument (docs/producers.md): DROP + CREATE of both, with 0009's grants and pinned
  search_path; a call without it is unchanged. Downgrading restores 0009's functions.

Additive: code at 0009_producer_api never reads what this adds. Downgrading drops it.
"""

import importlib.util
from pathlib import Path
from types import ModuleType

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


def _v1() -> ModuleType:
    """0009_producer_api's module: its function texts, grants and search_path pinning."""
    path = Path(__file__).with_name("0009_producer_api.py")
    spec = importlib.util.spec_from_file_location("hango_migration_0009", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _replace(text: str, old: str, new: str) -> str:
    if old not in text:
        raise RuntimeError(f"0010_tenants: 0009's function text changed; not found: {old!r}")
    return text.replace(old, new)


_RUN_ARGS = "text, text, jsonb, uuid, text, jsonb"  # hango_enqueue_run in 0009
_API_ARGS = "text, jsonb, uuid, text, text, jsonb"  # hango_api.enqueue in 0009


def _enqueue_v2(v1: ModuleType) -> tuple[str, str]:
    """0009's enqueue functions with `priority int DEFAULT 0` last, checked and stored."""
    run = _replace(
        v1.ENQUEUE_RUN,
        "idempotency_key text, config jsonb\n) RETURNS TABLE",
        "idempotency_key text, config jsonb,\n    priority int DEFAULT 0\n) RETURNS TABLE",
    )
    run = _replace(
        run,
        "    t := hango_tenant_id(tenant);\n",
        "    IF hango_enqueue_run.priority IS NULL\n"
        "       OR hango_enqueue_run.priority NOT BETWEEN 0 AND 1000 THEN\n"
        "        RAISE EXCEPTION 'priority must be 0 to 1000 (higher is claimed first), got %',\n"
        "            coalesce(hango_enqueue_run.priority::text, 'NULL') USING ERRCODE = 'QH003';\n"
        "    END IF;\n"
        "    t := hango_tenant_id(tenant);\n",
    )
    run = _replace(
        run,
        "input, idempotency_key)\n        VALUES (gen_random_uuid(), t, s, a, ri, k)",
        "input, idempotency_key, priority)\n"
        "        VALUES (gen_random_uuid(), t, s, a, ri, k, hango_enqueue_run.priority)",
    )
    api = _replace(
        v1.API_ENQUEUE,
        "tenant text DEFAULT NULL, config jsonb DEFAULT NULL\n) RETURNS uuid",
        "tenant text DEFAULT NULL, config jsonb DEFAULT NULL, priority int DEFAULT 0\n"
        ") RETURNS uuid",
    )
    api = _replace(api, "enqueue.config) e", "enqueue.config, enqueue.priority) e")
    return run, api


def _swap_enqueue(old: str, run: str, api: str, new: str, v1: ModuleType) -> None:
    """Replace both enqueue functions: `old`/`new` is "" (0009's) or ", int" (priority)."""
    op.execute(f"DROP FUNCTION hango_api.enqueue({_API_ARGS}{old})")
    op.execute(f"DROP FUNCTION hango_enqueue_run({_RUN_ARGS}{old})")
    op.execute(run)
    op.execute(f"REVOKE ALL ON FUNCTION hango_enqueue_run({_RUN_ARGS}{new}) FROM PUBLIC")
    op.execute(api)
    op.execute(f"REVOKE ALL ON FUNCTION hango_api.enqueue({_API_ARGS}{new}) FROM PUBLIC")
    grant = f"GRANT EXECUTE ON FUNCTION hango_api.enqueue({_API_ARGS}{new}) TO {v1.ROLE}"
    op.execute(v1.if_role(grant))
    op.execute(v1.PIN_SEARCH_PATH)


def upgrade() -> None:
    # every table this step alters, at once, in the order the fleet's own statements lock
    # them (a run's insert takes runs, then the tenant and agent it references), so a
    # worker's transaction waits for this step instead of deadlocking with it
    # (tests/test_migrations_under_load.py)
    op.execute("LOCK TABLE runs, agents, tenants IN ACCESS EXCLUSIVE MODE")
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
    v1 = _v1()
    run, api = _enqueue_v2(v1)
    _swap_enqueue("", run, api, ", int", v1)


def downgrade() -> None:
    v1 = _v1()
    _swap_enqueue(", int", v1.ENQUEUE_RUN, v1.API_ENQUEUE, "", v1)
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
