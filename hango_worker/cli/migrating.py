"""`hango-worker migrate`: migrate, print the offline SQL, or print the admin SQL.

A failed migration is one line naming the PostgreSQL error and what to do, never a
traceback: every step runs in one transaction, so nothing was changed.
docs/operations.md "Migration privileges and timeouts".
"""

from __future__ import annotations

import argparse
import json
import sys

import asyncpg
import sqlalchemy.exc
from alembic.util import CommandError

from hango_worker.cli import exits
from hango_worker.cli.exits import CliError
from hango_worker.cli.subcommands import Subcommands, command
from hango_worker.config import Settings
from hango_worker.store import cluster, db, migrate

_PRIVILEGES = (
    "the migrating user must own the database, or have CREATE on it and on schema public "
    "(docs/operations.md, Migration privileges and timeouts)"
)


def register(sub: Subcommands) -> None:
    m = command(
        sub, "migrate", cmd_migrate, "migrate the database to the latest schema", tenanted=False
    )
    m.add_argument("--json", action="store_true", help='print {"from": …, "to": …}')
    m.add_argument(
        "--lock-timeout",
        default=migrate.LOCK_TIMEOUT,
        help=f"give up on a lock a migration waits for after this (default {migrate.LOCK_TIMEOUT})",
    )
    m.add_argument(
        "--statement-timeout",
        default=migrate.STATEMENT_TIMEOUT,
        help=f"the longest one statement may run (default {migrate.STATEMENT_TIMEOUT})",
    )
    what = m.add_mutually_exclusive_group()
    what.add_argument(
        "--sql", action="store_true", help="print the SQL to migrate an empty database (psql)"
    )
    what.add_argument(
        "--print-admin-sql",
        action="store_true",
        help="print the SQL a superuser runs once for the server-wide role (hango_producer)",
    )


def _timeouts(a: argparse.Namespace) -> dict[str, str]:
    try:
        return {
            "lock_timeout": migrate.check_duration("--lock-timeout", a.lock_timeout),
            "statement_timeout": migrate.check_duration("--statement-timeout", a.statement_timeout),
        }
    except ValueError as e:
        raise CliError(str(e), exits.USAGE) from None


def failure(before: str | None, e: sqlalchemy.exc.DBAPIError, timeouts: dict[str, str]) -> str:
    """One line for a migration PostgreSQL refused."""
    cause = e.orig.__cause__ if e.orig is not None else None
    if isinstance(cause, asyncpg.PostgresError):
        state, text = cause.sqlstate, str(cause.args[0] if cause.args else cause)
    else:
        state, text = getattr(e.orig, "sqlstate", None), str(e.orig)
    text = " ".join(text.split())[:500]
    what = {
        "42501": _PRIVILEGES,
        "55P03": f"a lock was not granted within lock_timeout={timeouts['lock_timeout']}: "
        "another transaction holds a table this migration changes; migrate again when it "
        "ends, or allow longer with --lock-timeout",
        "57014": f"a statement ran past statement_timeout={timeouts['statement_timeout']}; "
        "allow longer with --statement-timeout",
    }.get(str(state), "")
    return (
        f"cannot migrate from {before or 'an empty database'} (nothing was changed): "
        f"{text} [SQLSTATE {state}]" + (f"; {what}" if what else "")
    )


async def cmd_migrate(s: Settings, a: argparse.Namespace) -> int:
    if a.print_admin_sql:
        print(cluster.ADMIN_SQL, end="")
        return exits.OK
    timeouts = _timeouts(a)
    if a.sql:
        print(migrate.offline_sql("head", **timeouts), end="")
        return exits.OK
    async with db.resolve(s.database_url, s.data_dir) as dsn:
        before = await db.schema_revision(dsn)  # Unavailable: unreachable, missing, refused
        try:
            notes = await migrate.upgrade_and_seed(dsn, **timeouts)
        except CommandError:
            raise CliError(
                f"cannot migrate: the database is at revision {before!r}, which this version "
                f"does not know (its newest is {migrate.head_revision()!r}); a newer "
                "hango-worker migrated it: run that version, or downgrade the database with it",
                exits.UNAVAILABLE,
            ) from None
        except migrate.SchemaNewerThanCode as e:
            raise CliError(
                f"cannot migrate: {e} (revision {before!r}, which this version does not know; "
                "a newer hango-worker migrated it)",
                exits.UNAVAILABLE,
            ) from None
        except sqlalchemy.exc.DBAPIError as e:
            raise CliError(failure(before, e, timeouts), exits.UNAVAILABLE) from None
    for note in notes:
        print(f"hango-worker: {note}", file=sys.stderr)
    head = migrate.head_revision()
    print(json.dumps({"from": before, "to": head}) if a.json else f"migrated to {head}")
    return exits.OK
