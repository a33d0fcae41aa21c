"""Postgres: the schema (SQLAlchemy Core metadata, migrated by alembic), the
hot-path SQL (asyncpg prepared statements) and the embedded server.

Sits beside the agent layer. May import: `provider` (its types), `telemetry`,
`config`, `vocab`. Never imports `tool`, `agent` or `run` (import-linter contracts
in `.importlinter`, `make lint`).
"""
