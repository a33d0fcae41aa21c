"""Waiting runs: status 'waiting', what a run waits for, and the decisions that wake it.

Revision ID: 0006_waiting
Revises: 0005_memories

- runs.status may be 'waiting' (the check constraint is replaced): the run is
  suspended for a person — an approval or an answer — with no lease and no worker.
- runs.waiting_for (jsonb): the call it waits on and the calls of its batch not yet
  started; runs.waiting_since / runs.waiting_until (the approval timeout).
- run_decisions: one row per decided call (approve, reject, answer, timeout).

Code at 0005 never writes 'waiting' and never reads the new columns, so it still
runs on this schema (it would not claim a waiting run). Downgrading fails waiting
runs first (the old constraint does not allow the status), then drops all of it.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0006_waiting"
down_revision = "0005_memories"
branch_labels = None
depends_on = None
serves_code_since = "0005_memories"

_OLD = "'queued', 'running', 'succeeded', 'failed', 'cancelled'"
_NEW = "'queued', 'running', 'waiting', 'succeeded', 'failed', 'cancelled'"


def upgrade() -> None:
    op.drop_constraint("runs_status_check", "runs", type_="check")
    op.create_check_constraint("runs_status_check", "runs", f"status IN ({_NEW})")
    op.add_column("runs", sa.Column("waiting_for", pg.JSONB))
    op.add_column("runs", sa.Column("waiting_since", sa.DateTime(timezone=True)))
    op.add_column("runs", sa.Column("waiting_until", sa.DateTime(timezone=True)))
    op.create_index(
        "runs_waiting_idx",
        "runs",
        ["waiting_until"],
        postgresql_where=sa.text("status = 'waiting'"),
    )
    op.create_table(
        "run_decisions",
        sa.Column(
            "run_id",
            pg.UUID(as_uuid=False),
            sa.ForeignKey("runs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("message_seq", sa.Integer, primary_key=True),
        sa.Column("tool_use_id", sa.Text, primary_key=True),
        sa.Column("decision", sa.Text, nullable=False),
        sa.Column("input", pg.JSONB),
        sa.Column("text", sa.Text),
        sa.Column("decided_by", sa.Text),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.CheckConstraint(
            "decision IN ('approve', 'reject', 'answer', 'timeout')",
            name="run_decisions_decision_check",
        ),
    )


def downgrade() -> None:
    op.drop_table("run_decisions")
    op.execute(
        "UPDATE runs SET status = 'failed', finished_at = now(), error = jsonb_build_object("
        "'type', 'internal_error', 'message', 'the schema was downgraded while this run "
        "was waiting for a decision') WHERE status = 'waiting'"
    )
    op.drop_index("runs_waiting_idx", table_name="runs")
    op.drop_column("runs", "waiting_until")
    op.drop_column("runs", "waiting_since")
    op.drop_column("runs", "waiting_for")
    op.drop_constraint("runs_status_check", "runs", type_="check")
    op.create_check_constraint("runs_status_check", "runs", f"status IN ({_OLD})")
