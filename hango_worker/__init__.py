"""hango-worker: a durable, observable run-worker for LLM agents on Postgres."""

__version__ = "0.1.0"
