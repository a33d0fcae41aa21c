"""Per-turn state: run_states, so a run can be forked from any turn.

Revision ID: 0007_run_states
Revises: 0006_waiting

- run_states: the run's state_json at the end of a turn, written in that turn's
  checkpoint only when it changed since the last one kept (a run's todos change a
  few times, not every turn); removed with the run.

Additive: code at 0006 never reads it. Downgrading drops it.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0007_run_states"
down_revision = "0006_waiting"
branch_labels = None
depends_on = None
serves_code_since = "0006_waiting"


def upgrade() -> None:
    op.create_table(
        "run_states",
        sa.Column(
            "run_id",
            pg.UUID(as_uuid=False),
            sa.ForeignKey("runs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("turn", sa.Integer, primary_key=True),
        sa.Column("state_json", pg.JSONB, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )


def downgrade() -> None:
    op.drop_table("run_states")
