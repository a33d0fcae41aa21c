"""messages lose their foreign key to sessions (the one to runs stays).

Revision ID: 0011_messages_session_fk
Revises: 0010_tenants

Every message row names its run (`run_id`, a foreign key to runs, ON DELETE CASCADE),
and its `session_id` is that run's session, copied from the runs row by every statement
that writes messages (the fenced CHECKPOINT / CHECKPOINT_MANY take it from the fence's
RETURNING; `runs fork` from the session and run it has just created). runs.session_id is
itself a foreign key to sessions, so the check `messages.session_id → sessions` repeats
one already made, on the hottest insert of the schema: one index probe and row lock of
the session per message, measured at about 8 % of Postgres CPU per one-turn run
(docs/scaling.md, "Foreign-key checks on the checkpoint's inserts").

Compatible both ways: no code reads the constraint. Downgrading adds it back, validated
(a message whose session is missing, which no statement of hango-worker writes, would
make the downgrade fail and say which constraint).
"""

from alembic import op

revision = "0011_messages_session_fk"
down_revision = "0010_tenants"
branch_labels = None
depends_on = None
serves_code_since = "0009_producer_api"  # as 0010 does: dropping a check breaks no code


def upgrade() -> None:
    # dropping the key locks both tables; take them in the order a message's insert does
    # (the session it references is locked before the message table by a run's insert),
    # so a worker's transaction waits instead of deadlocking
    # (tests/test_migrations_under_load.py)
    op.execute("LOCK TABLE sessions, messages IN ACCESS EXCLUSIVE MODE")
    op.drop_constraint("messages_session_id_fkey", "messages", type_="foreignkey")


def downgrade() -> None:
    op.create_foreign_key(
        "messages_session_id_fkey", "messages", "sessions", ["session_id"], ["id"]
    )
