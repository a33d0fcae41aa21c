"""`hango-worker` — the command line: run the service, migrate, enqueue, inspect.

Every failure is one line on stderr and a documented exit code (`exits`);
never a traceback.

A program over every layer. May import: `hango_worker` (the version), `agent`,
`config`, `console`, `demo`, `provider`, `render`, `run`, `service`, `store`,
`telemetry`, `tool`, `vocab`, `watch`. Never imports `client` (the Python client for
users' code) or the test helpers in `testing` (import-linter contracts in
`.importlinter`, `make lint`).
"""

from __future__ import annotations

import asyncio
import os
import sys

import asyncpg

from hango_worker.cli import exits
from hango_worker.cli.exits import CliError
from hango_worker.cli.parser import build_parser
from hango_worker.config import ConfigError, load_settings
from hango_worker.store import db, repo
from hango_worker.tool.registry import ToolLoadError

__all__ = ["CliError", "build_parser", "main"]


def _failure(e: BaseException) -> tuple[str, int]:
    """The one line and the exit code for an error a command raised."""
    if isinstance(e, CliError):
        return str(e), e.code
    if isinstance(e, ConfigError | ToolLoadError):
        return str(e), exits.USAGE
    if isinstance(e, repo.NotFound):
        return str(e.args[0] if e.args else e), exits.NOT_FOUND
    if isinstance(e, repo.Conflict):
        return str(e), exits.CONFLICT
    if isinstance(e, db.Unavailable):
        return str(e), exits.UNAVAILABLE
    return db.describe_connect_error("the database", e), exits.UNAVAILABLE


def _quiet_stdout() -> None:
    """stdout's reader is gone: point stdout at /dev/null so the exit flush is silent."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
        code: int = asyncio.run(args.fn(settings, args))
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        _quiet_stdout()
        return exits.BROKEN_PIPE
    except KeyboardInterrupt:
        return exits.INTERRUPTED
    except (
        CliError,
        ConfigError,
        ToolLoadError,
        repo.NotFound,
        repo.Conflict,
        db.Unavailable,
        OSError,
        asyncpg.PostgresConnectionError,
        asyncpg.InterfaceError,
    ) as e:
        message, code = _failure(e)
        print(f"hango-worker: {message}", file=sys.stderr)
        return code
