"""Telemetry: tracing, metrics, logs and their endpoints.

A leaf. May import: `vocab` (the labels' values). Never imports anything else from
hango_worker (import-linter contracts in `.importlinter`, `make lint`).
"""
