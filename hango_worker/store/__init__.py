"""Postgres: the schema (SQLAlchemy Core metadata, migrated by alembic), the
hot-path SQL (asyncpg prepared statements) and the embedded server.

Sits beside the agent layer: it imports only `provider` types, never `agent` or `run`.
"""
