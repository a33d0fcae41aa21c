"""Drains hand work back without counting it: runs.handed_back.

Revision ID: 0018_handed_back
Revises: 0017_run_output

- runs.handed_back (int, NOT NULL, default 0): how many of the run's claims ended in a
  hand-back by a stopping worker (a release at a turn boundary, or the hand-back of a
  run cancelled at the end of the shutdown grace). `attempt` stays the claim counter
  that fences every write; the attempts that count are `attempt - handed_back`
  (docs/operations.md, "Crashes, deploys and what happens to runs").

A column with a constant default is a catalog change on PostgreSQL 11 and later (no
rewrite): the lock on runs is held for an instant. Older code never names the column
and leaves it as it is, so code at 0009 and later still runs on this schema.
"""

import sqlalchemy as sa
from alembic import op

revision = "0018_handed_back"
down_revision = "0017_run_output"
branch_labels = None
depends_on = None
serves_code_since = "0009_producer_api"


def upgrade() -> None:
    op.add_column(
        "runs",
        sa.Column("handed_back", sa.Integer, nullable=False, server_default=sa.text("0")),
    )


def downgrade() -> None:
    op.drop_column("runs", "handed_back")
