"""hango-worker: a durable, observable run-worker for LLM agents on Postgres.

The package root holds the version only. May import: nothing else in the package.
Only `cli` and `testing` import it; every other component never does (import-linter
contracts in `.importlinter`, `make lint`).
"""

from importlib.metadata import PackageNotFoundError, version

try:  # the installed distribution's version (pyproject.toml), never a copy of it here
    __version__ = version("hango-worker")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "unknown"
