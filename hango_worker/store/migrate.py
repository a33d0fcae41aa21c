"""Run alembic migrations programmatically (used by the CLI, the demo and tests), and decide
whether this code can serve the database's schema (readiness).

The migration environment is the repository's top-level `alembic/` folder; a built wheel
carries the same files as `hango_worker/_alembic` (pyproject.toml maps the folder into the
package), so `hango-worker migrate` works from an installed wheel too.

Schema compatibility (expand, then contract; docs/operations.md "Upgrades and rollback"):
each revision file may declare `serves_code_since = "<revision>"`, the oldest code
revision that still works on a database at that revision (an additive revision serves
the code before it; a revision that drops or renames what older code uses serves only
itself, which is also the default when the file declares nothing). After every migration
the migration environment writes the oldest code revision the database's schema serves
into a comment on the `alembic_version` table, so that *older* code, which has never seen
the newer revision files, can still tell whether it may run (`schema_problem`).
"""

from __future__ import annotations

import asyncio
import io
import logging
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

log = logging.getLogger(__name__)

PACKAGE = Path(__file__).resolve().parent.parent
SHIPPED = PACKAGE / "_alembic"  # inside an installed wheel
CHECKOUT = PACKAGE.parent / "alembic"  # a source checkout (and editable installs)

# the comment on alembic_version: "hango-worker: schema <revision> serves code since <revision>"
_COMPAT_RE = re.compile(r"hango-worker: schema (\S+) serves code since (\S+)")


def script_location() -> Path:
    for where in (SHIPPED, CHECKOUT):
        if (where / "env.py").is_file():
            return where
    raise RuntimeError(f"migrations not found: neither {SHIPPED} nor {CHECKOUT} has env.py")


def sqlalchemy_url(dsn: str) -> str:
    """postgresql://… → postgresql+asyncpg://… (what alembic's async env uses)."""
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if dsn.startswith(prefix):
            return "postgresql+asyncpg://" + dsn[len(prefix) :]
    raise ValueError(f"not a postgres URL: {dsn.split('@')[-1]!r}")


# Every migration run sets these (alembic/env.py, right after taking the migration lock),
# so no migration, present or future, queues a table behind it for long or runs without
# bound. Override: `hango-worker migrate --lock-timeout 30s --statement-timeout 1h`, or
# `alembic -x lock_timeout=30s -x statement_timeout=1h upgrade head`.
# docs/operations.md "Migration privileges and timeouts".
LOCK_TIMEOUT = "5s"
STATEMENT_TIMEOUT = "10min"
TIMEOUT_OPTIONS = ("lock_timeout", "statement_timeout")
_DURATION = re.compile(r"[0-9]{1,9}(ms|s|min|h|d)?")


def check_duration(name: str, value: str) -> str:
    """A PostgreSQL duration setting ('5s', '500ms', '10min', '0' = none) or ValueError."""
    if not _DURATION.fullmatch(value):
        raise ValueError(
            f"{name} {value!r} is not a duration: a whole number with ms, s, min, h or d "
            "(e.g. 5s, 10min; 0 turns it off)"
        )
    return value


def timeout_statements(lock_timeout: str, statement_timeout: str) -> list[str]:
    """The SET statements every migration run starts with (session-wide, so a migration
    that commits part of its work in an autocommit block keeps them)."""
    return [
        f"SET lock_timeout = '{check_duration('lock_timeout', lock_timeout)}'",
        f"SET statement_timeout = '{check_duration('statement_timeout', statement_timeout)}'",
    ]


def alembic_config(
    dsn: str | None = None,
    *,
    lock_timeout: str = LOCK_TIMEOUT,
    statement_timeout: str = STATEMENT_TIMEOUT,
) -> Config:
    """The configuration `hango-worker migrate` uses (no alembic.ini needed)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    if dsn is not None:
        cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(dsn).replace("%", "%%"))
    cfg.set_main_option("hango.lock_timeout", check_duration("lock_timeout", lock_timeout))
    cfg.set_main_option(
        "hango.statement_timeout", check_duration("statement_timeout", statement_timeout)
    )
    return cfg


def configured_timeouts(x_arguments: dict[str, str], cfg: Config) -> tuple[str, str]:
    """(lock_timeout, statement_timeout) for alembic/env.py: `-x` first, then what
    `alembic_config` set, then the defaults above."""
    lock, statement = (
        x_arguments.get(name) or cfg.get_main_option(f"hango.{name}") or default
        for name, default in zip(TIMEOUT_OPTIONS, (LOCK_TIMEOUT, STATEMENT_TIMEOUT), strict=True)
    )
    return str(lock), str(statement)


@cache
def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


@dataclass(frozen=True)
class Revision:
    revision: str
    serves_code_since: str


def chain_of(script: ScriptDirectory) -> tuple[Revision, ...]:
    """A migration folder's revisions, oldest first (one linear history)."""
    heads = script.get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migrations must have exactly one head, found {heads}")
    out = []
    for sc in script.walk_revisions("base", "heads"):
        declared = getattr(sc.module, "serves_code_since", None)
        out.append(Revision(sc.revision, str(declared) if declared else sc.revision))
    return tuple(reversed(out))


@cache
def revisions() -> tuple[Revision, ...]:
    """This code's revisions, oldest first."""
    return chain_of(_script())


def head_revision() -> str:
    return revisions()[-1].revision


def oldest_code_served(chain: tuple[Revision, ...], revision: str) -> str:
    """The oldest code revision that works on a database at `revision`."""
    index = {r.revision: i for i, r in enumerate(chain)}
    top = index[revision]
    oldest = top
    # every revision above a candidate must still serve that candidate
    for candidate in range(top - 1, -1, -1):
        above = chain[candidate + 1 : top + 1]
        if all(index.get(r.serves_code_since, top + 1) <= candidate for r in above):
            oldest = candidate
        else:
            break
    return chain[oldest].revision


def compat_comment(revision: str, serves_code_since: str) -> str:
    return f"hango-worker: schema {revision} serves code since {serves_code_since}"


def compat_comment_sql(script: ScriptDirectory, revision: str) -> str:
    """The statement that records, on the database, the oldest code its schema serves."""
    text = compat_comment(revision, oldest_code_served(chain_of(script), revision))
    return "COMMENT ON TABLE alembic_version IS '" + text.replace("'", "''") + "'"


def schema_problem(db_revision: str | None, comment: str | None) -> str | None:
    """Why this code cannot serve a database at `db_revision` (None: it can).

    Ready when the database is at this code's head, or newer and still serving it (the
    revisions above our head are all additive for it). Not ready when it is behind.
    """
    chain = [r.revision for r in revisions()]
    head = chain[-1]
    if db_revision is None:
        return f"database has no schema; code expects {head}: run `hango-worker migrate`"
    if db_revision == head:
        return None
    if db_revision in chain[:-1]:
        return (
            f"database schema {db_revision} is older than this code's {head}: "
            "run `hango-worker migrate`"
        )
    found = _COMPAT_RE.fullmatch(comment or "")
    # a comment written for another revision (the version set by hand) says nothing
    serves = found.group(2) if found and found.group(1) == db_revision else None
    if serves in chain:
        return None  # a newer schema that still serves our head (or older code)
    return (
        f"database schema {db_revision} is newer than this code's {head} and no longer serves "
        f"it (it serves code since {serves or 'an unrecorded revision'}): deploy newer code "
        "or downgrade the database"
    )


async def read_schema_state(conn: Any) -> tuple[str | None, str | None]:
    """(the database's revision, the compatibility comment) on an asyncpg connection."""
    exists = await conn.fetchval("SELECT to_regclass('alembic_version') IS NOT NULL")
    if not exists:
        return None, None
    row = await conn.fetchrow(
        "SELECT (SELECT version_num FROM alembic_version LIMIT 1) AS rev, "
        "obj_description('alembic_version'::regclass, 'pg_class') AS comment"
    )
    return row["rev"], row["comment"]


async def upgrade(dsn: str, revision: str = "head", **timeouts: str) -> None:
    """Migrate to `revision`; `timeouts`: lock_timeout=, statement_timeout= (durations)."""
    await asyncio.to_thread(command.upgrade, alembic_config(dsn, **timeouts), revision)


def offline_sql(revision: str = "head", **timeouts: str) -> str:
    """The SQL script from an empty database to `revision`, for psql (no database used)."""
    buffer = io.StringIO()
    cfg = alembic_config(**timeouts)
    cfg.output_buffer = buffer
    command.upgrade(cfg, revision, sql=True)
    return buffer.getvalue()


async def downgrade(dsn: str, revision: str) -> None:
    await asyncio.to_thread(command.downgrade, alembic_config(dsn), revision)


class SchemaNewerThanCode(RuntimeError):
    """The database is at a revision this code does not know and no longer serves."""


async def upgrade_and_seed(dsn: str, **timeouts: str) -> list[str]:
    """Migrate to head, then make sure the default tenant exists (what `migrate` does).
    Returns one line per cluster-level object left for an admin (store/cluster.py).

    On a database that is already *newer* than this code (a rollback re-running an
    older release's migrate step) nothing is migrated: fine while that schema still
    serves this code, `SchemaNewerThanCode` (naming both revisions) when it does not."""
    from hango_worker.store import cluster, db, repo

    conn = await db.connect(dsn)
    try:
        db_revision, comment = await read_schema_state(conn)
    finally:
        await conn.close()
    if db_revision is not None and db_revision not in {r.revision for r in revisions()}:
        problem = schema_problem(db_revision, comment)
        if problem is not None:
            raise SchemaNewerThanCode(problem)
        log.warning(
            "database schema %s is newer than this code's %s and still serves it: "
            "nothing to migrate",
            db_revision,
            head_revision(),
        )
    else:
        await upgrade(dsn, "head", **timeouts)
    conn = await db.connect(dsn)
    try:
        await repo.ensure_default_tenant(conn)
        notes = await cluster.missing_objects(conn)
    finally:
        await conn.close()
    return notes
