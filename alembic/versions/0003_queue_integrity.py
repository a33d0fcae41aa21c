"""Queue integrity: runs.queued_at, runs.idempotency_key, tool_calls.message_seq.

Revision ID: 0003_queue_integrity
Revises: 0002_run_state

- runs.queued_at: when the run last entered the queue (enqueue, resume, release,
  reclaim); existing rows get their created_at.
- runs.idempotency_key with a unique partial index per tenant.
- tool_calls.message_seq: the assistant message that made the call (a model
  may reuse a tool_use id in a later turn). The key stays (run_id, tool_use_id),
  so code of the previous revision keeps working against this schema (its rows
  get NULL); existing rows get the seq of the newest assistant message of their
  run that holds the call.

Downgrading drops all three.
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_queue_integrity"
down_revision = "0002_run_state"
branch_labels = None
depends_on = None
# additive only (new nullable or defaulted columns, an index): code at 0002 still runs on it
serves_code_since = "0002_run_state"


def upgrade() -> None:
    op.add_column(
        "runs",
        sa.Column(
            "queued_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    op.execute("UPDATE runs SET queued_at = created_at")
    op.add_column("runs", sa.Column("idempotency_key", sa.Text))
    op.create_index(
        "runs_idempotency_key_idx",
        "runs",
        ["tenant_id", "idempotency_key"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.add_column("tool_calls", sa.Column("message_seq", sa.Integer))
    op.execute(
        "UPDATE tool_calls t SET message_seq = (SELECT max(m.seq) FROM messages m "
        "WHERE m.run_id = t.run_id AND m.role = 'assistant' AND jsonb_typeof(m.content) = 'array' "
        "AND m.content @> jsonb_build_array(jsonb_build_object('type', 'tool_use', "
        "'id', t.tool_use_id)))"
    )


def downgrade() -> None:
    op.drop_column("tool_calls", "message_seq")
    op.drop_index("runs_idempotency_key_idx", table_name="runs")
    op.drop_column("runs", "idempotency_key")
    op.drop_column("runs", "queued_at")
