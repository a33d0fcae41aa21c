"""Cluster-level objects: what a database owner may not be able to create.

The producer SQL API (docs/producers.md) is granted to the role `hango_producer`. Roles
belong to the whole PostgreSQL server, not to one database, so creating one needs
CREATEROLE (or a superuser), which a normal database owner on a managed Postgres does
not have. The migrations therefore treat the role as optional (docs/operations.md
"Migration privileges"):

- migration 0009 creates the role when it may, and otherwise skips it (a WARNING in the
  SQL output; `hango-worker migrate` prints `missing_role_note` as one line);
- every migration run ends with `GRANTS_SQL`, which grants the API to the role when the
  role and the API exist, so running `hango-worker migrate` again after an admin ran
  `ADMIN_SQL` (`hango-worker migrate --print-admin-sql`) completes the set-up.
"""

from __future__ import annotations

from typing import Any

ROLE = "hango_producer"
API_SCHEMA = "hango_api"

# Once per server, by a superuser or a role with CREATEROLE. Safe to run again.
ADMIN_SQL = f"""\
-- hango-worker: the cluster-level objects the migrations could not create.
-- Run once per PostgreSQL server as a superuser or a role with CREATEROLE, e.g.
--   hango-worker migrate --print-admin-sql | psql "postgresql://admin@host/postgres"
-- then run `hango-worker migrate` again as the database owner: it grants the
-- producer API (schema {API_SCHEMA}) to the role.
DO $do$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
        CREATE ROLE {ROLE} NOLOGIN;
    END IF;
END $do$;
"""

# The producer API's privileges (what 0009 grants), granted again after every migration
# run when the role exists: idempotent, and the only step that needs the role.
GRANTS_SQL = f"""\
DO $do$ BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}')
            AND to_regnamespace('{API_SCHEMA}') IS NOT NULL THEN
        GRANT USAGE ON SCHEMA {API_SCHEMA} TO {ROLE};
        GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {API_SCHEMA} TO {ROLE};
        GRANT SELECT ON ALL TABLES IN SCHEMA {API_SCHEMA} TO {ROLE};
    END IF;
END $do$"""

_MISSING = f"""
SELECT current_user AS who FROM (SELECT 1) x
WHERE to_regnamespace('{API_SCHEMA}') IS NOT NULL
  AND NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}')
"""


def missing_role_note(user: str) -> str:
    return (
        f"the role {ROLE} does not exist and {user} may not create it (roles are "
        "server-wide: CREATEROLE), so the producer SQL API has no role yet; as a superuser "
        "or a role with CREATEROLE run the SQL `hango-worker migrate --print-admin-sql` "
        "prints, then `hango-worker migrate` again"
    )


async def missing_objects(conn: Any) -> list[str]:
    """One line per cluster-level object the database's schema expects but lacks."""
    who = await conn.fetchval(_MISSING)
    return [] if who is None else [missing_role_note(str(who))]
