"""The producer SQL API: schema hango_api (enqueue, cancel, resume, the runs view), role hango_producer.

Revision ID: 0009_producer_api
Revises: 0008_subagents_skills

The stable contract for producers in any language (docs/producers.md):
- hango_api.enqueue(agent, input, session, idempotency_key, tenant, config) → run id;
  hango_api.cancel(run_id, tenant) → status; hango_api.resume(run_id, tenant);
  the view hango_api.runs (status, usage, result text).
- hango_enqueue_run(...) beside the tables (not part of the contract): the one
  implementation of enqueue; hango_api.enqueue and the Python client both call it.
  hango_tenant_id(tenant) resolves a tenant name or id.
- Errors carry SQLSTATEs of class QH (docs/producers.md "Errors"): QH001 unknown tenant,
  QH002 unknown agent, QH003 malformed argument, QH004 unknown session, QH005 unknown
  run, QH006 the run is in a state that forbids it.
- The role hango_producer (NOLOGIN) may use the schema, call its functions and read its
  view, nothing else. Roles are cluster-wide: it is created only if missing and never
  dropped (other databases on the same server may use it); downgrading drops the schema,
  and with it every privilege granted on it. A user that may not create it (a database
  owner without CREATEROLE) migrates without it: the role is skipped with a WARNING and
  the grants wait for it (hango_worker/store/cluster.py; `migrate --print-admin-sql`).

The API functions are SECURITY DEFINER (they run as the owner of the tables) with
search_path pinned to the tables' schema then pg_temp. Changing a function's arguments
(even adding a defaulted one) is DROP FUNCTION + CREATE FUNCTION in one migration, never a
second CREATE beside the first: two overloads that both accept a call make it ambiguous.
tests/test_producer_api.py pins the signatures and the view's columns.

Additive: code at 0008_subagents_skills never reads what this adds. Downgrading drops it.
"""

from alembic import op

revision = "0009_producer_api"
down_revision = "0008_subagents_skills"
branch_labels = None
depends_on = None
serves_code_since = "0008_subagents_skills"

ROLE = "hango_producer"
DEFAULT_TENANT = "00000000-0000-0000-0000-000000000001"

CREATE_ROLE = f"""
DO $do$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
        BEGIN
            CREATE ROLE {ROLE} NOLOGIN;
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN NULL;  -- created meanwhile
            WHEN insufficient_privilege THEN  -- optional: hango_worker/store/cluster.py
                RAISE WARNING 'the role {ROLE} does not exist and this user may not create it: '
                    'skipped, the producer API is granted to nobody yet'
                    USING HINT = 'as a superuser (or a role with CREATEROLE) run the SQL of '
                        '`hango-worker migrate --print-admin-sql`, then migrate again';
        END;
    END IF;
END $do$
"""



def if_role(statement: str) -> str:
    """`statement` run only when the role exists: a database owner without CREATEROLE
    migrates without it (hango_worker/store/cluster.py grants it later)."""
    return (
        f"DO $do$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN "
        f"EXECUTE $q${statement}$q$; END IF; END $do$"
    )


TENANT_ID = f"""
CREATE FUNCTION hango_tenant_id(tenant text) RETURNS uuid
LANGUAGE plpgsql STABLE AS $fn$
DECLARE t uuid;
BEGIN
    IF tenant IS NULL THEN
        RETURN '{DEFAULT_TENANT}'::uuid;
    END IF;
    SELECT x.id INTO t FROM tenants x WHERE x.name = tenant OR x.id::text = lower(tenant)
        ORDER BY x.name = tenant DESC LIMIT 1;
    IF t IS NULL THEN
        RAISE EXCEPTION 'no tenant %', quote_literal(tenant) USING ERRCODE = 'QH001',
            HINT = 'tenant is a tenant''s name or id; NULL means the default tenant';
    END IF;
    RETURN t;
END $fn$
"""

# What runs.input holds: {"text": ...} from `input`, plus `config`'s limits / memory_key
# (the keys the worker reads; it validates the limits fully when it loads the run).
RUN_INPUT = r"""
CREATE FUNCTION hango_run_input(input jsonb, config jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    k text;
    mk jsonb;
    extra jsonb;
    limits text[] := ARRAY['max_turns', 'max_input_tokens', 'max_output_tokens',
        'max_cost_usd', 'max_tool_calls', 'tool_call_limits', 'max_duration_s', 'deadline'];
BEGIN
    IF input IS NULL OR jsonb_typeof(input) <> 'object' THEN
        RAISE EXCEPTION 'input must be a JSON object like {"text": "..."}, got %',
            coalesce(jsonb_typeof(input), 'NULL') USING ERRCODE = 'QH003';
    END IF;
    IF input - 'text' <> '{}'::jsonb THEN  -- expressions, not queries, on the way through
        SELECT min(x) INTO k FROM jsonb_object_keys(input - 'text') x;
        RAISE EXCEPTION 'input has an unknown key %: it holds only "text" (limits and '
            'memory_key go in config)', quote_literal(k) USING ERRCODE = 'QH003';
    END IF;
    IF jsonb_typeof(input->'text') IS DISTINCT FROM 'string' OR input->>'text' = '' THEN
        RAISE EXCEPTION 'input.text must be a non-empty string' USING ERRCODE = 'QH003';
    END IF;
    IF config IS NULL THEN
        RETURN input;
    END IF;
    IF jsonb_typeof(config) <> 'object' THEN
        RAISE EXCEPTION 'config must be a JSON object or NULL, got %', jsonb_typeof(config)
            USING ERRCODE = 'QH003';
    END IF;
    IF config - 'limits' - 'memory_key' <> '{}'::jsonb THEN
        SELECT min(x) INTO k FROM jsonb_object_keys(config - 'limits' - 'memory_key') x;
        RAISE EXCEPTION 'config has an unknown key %: it takes "limits" and "memory_key"',
            quote_literal(k) USING ERRCODE = 'QH003';
    END IF;
    IF config ? 'limits' THEN
        IF jsonb_typeof(config->'limits') <> 'object' THEN
            RAISE EXCEPTION 'config.limits must be a JSON object' USING ERRCODE = 'QH003';
        END IF;
        extra := (config->'limits') - limits;
        IF extra <> '{}'::jsonb THEN
            SELECT min(x) INTO k FROM jsonb_object_keys(extra) x;
            RAISE EXCEPTION 'config.limits has an unknown key %', quote_literal(k)
                USING ERRCODE = 'QH003', HINT = 'docs/operations.md lists the per-run limits';
        END IF;
    END IF;
    mk := config->'memory_key';
    IF mk IS NOT NULL AND (jsonb_typeof(mk) <> 'string' OR btrim(mk #>> '{}') = ''
            OR length(mk #>> '{}') > 200 OR (mk #>> '{}') ~ '[\x01-\x1f\x7f-\x9f]') THEN
        RAISE EXCEPTION 'config.memory_key must be a string of 1 to 200 printable characters'
            USING ERRCODE = 'QH003';
    END IF;
    RETURN input || config;
END $fn$
"""

# The one implementation of enqueue (hango_api.enqueue and the Python client call it).
ENQUEUE_RUN = """
CREATE FUNCTION hango_enqueue_run(
    tenant text, agent text, input jsonb, session uuid, idempotency_key text, config jsonb
) RETURNS TABLE (run_id uuid, session_id uuid, created boolean)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE t uuid; a uuid; s uuid; r uuid; ri jsonb; k text := idempotency_key;
BEGIN
    ri := hango_run_input(input, config);
    IF k IS NOT NULL AND length(k) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'an idempotency key must be 1 to 200 characters, got %', length(k)
            USING ERRCODE = 'QH003';
    END IF;
    t := hango_tenant_id(tenant);
    IF k IS NOT NULL THEN
        SELECT x.id, x.session_id INTO r, s FROM runs x
            WHERE x.tenant_id = t AND x.idempotency_key = k;
        IF FOUND THEN
            RETURN QUERY SELECT r, s, false;
            RETURN;
        END IF;
    END IF;
    SELECT x.id INTO a FROM agents x WHERE x.tenant_id = t AND (x.name = agent OR x.id::text = agent)
        ORDER BY x.name = agent DESC LIMIT 1;
    IF a IS NULL THEN
        RAISE EXCEPTION 'no agent % in this tenant', quote_literal(agent) USING ERRCODE = 'QH002';
    END IF;
    IF session IS NULL THEN
        INSERT INTO sessions (id, tenant_id, agent_id) VALUES (gen_random_uuid(), t, a)
            RETURNING id INTO s;
    ELSE
        SELECT x.id INTO s FROM sessions x WHERE x.id = session AND x.tenant_id = t AND x.agent_id = a;
        IF s IS NULL THEN
            RAISE EXCEPTION 'no session % for agent % in this tenant', session, quote_literal(agent)
                USING ERRCODE = 'QH004';
        END IF;
    END IF;
    INSERT INTO runs (id, tenant_id, session_id, agent_id, input, idempotency_key)
        VALUES (gen_random_uuid(), t, s, a, ri, k)
        ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING id INTO r;
    IF r IS NULL THEN  -- lost a race to an enqueue with the same key: that run it is
        SELECT x.id, x.session_id INTO r, s FROM runs x
            WHERE x.tenant_id = t AND x.idempotency_key = k;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'a concurrent enqueue with idempotency key % has not committed',
                quote_literal(k) USING ERRCODE = '40001', HINT = 'retry the transaction';
        END IF;
        RETURN QUERY SELECT r, s, false;
        RETURN;
    END IF;
    PERFORM pg_notify('hango_runs', r::text);  -- wakes idle workers when this commits
    RETURN QUERY SELECT r, s, true;
END $fn$
"""

API_ENQUEUE = """
CREATE FUNCTION hango_api.enqueue(
    agent text, input jsonb, session uuid DEFAULT NULL, idempotency_key text DEFAULT NULL,
    tenant text DEFAULT NULL, config jsonb DEFAULT NULL
) RETURNS uuid
LANGUAGE sql SECURITY DEFINER AS $fn$
    SELECT e.run_id FROM hango_enqueue_run(enqueue.tenant, enqueue.agent, enqueue.input,
        enqueue.session, enqueue.idempotency_key, enqueue.config) e
$fn$
"""

# Queued and waiting runs (and running ones no worker holds) end at once; running ones at
# their next turn boundary; every descendant (subagent runs) likewise.
API_CANCEL = """
CREATE FUNCTION hango_api.cancel(run_id uuid, tenant text DEFAULT NULL) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE t uuid := hango_tenant_id(cancel.tenant); st text; c record;
BEGIN
    PERFORM FROM runs x WHERE x.id = cancel.run_id AND x.tenant_id = t;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no run % in this tenant', cancel.run_id USING ERRCODE = 'QH005';
    END IF;
    FOR c IN
        WITH RECURSIVE tree AS (
            SELECT x.id, 0 AS lvl FROM runs x WHERE x.id = cancel.run_id
            UNION ALL SELECT x.id, tr.lvl + 1 FROM runs x JOIN tree tr ON x.parent_run_id = tr.id
        ), now_ AS (
            SELECT x.id, tr.lvl, (x.status IN ('queued', 'waiting') OR (x.status = 'running'
                AND (x.lease_owner IS NULL OR x.lease_expires_at IS NULL))) AS at_once
            FROM runs x JOIN tree tr ON tr.id = x.id
            WHERE x.status IN ('queued', 'running', 'waiting')
        )
        UPDATE runs x SET cancel_requested = NOT n.at_once,
            status = CASE WHEN n.at_once THEN 'cancelled' ELSE x.status END,
            finished_at = CASE WHEN n.at_once THEN now() ELSE x.finished_at END,
            lease_owner = CASE WHEN n.at_once THEN NULL ELSE x.lease_owner END,
            lease_expires_at = CASE WHEN n.at_once THEN NULL ELSE x.lease_expires_at END
        FROM now_ n WHERE x.id = n.id
        RETURNING x.id, x.status, n.lvl
    LOOP
        IF c.lvl = 0 THEN
            st := c.status;
        ELSE
            PERFORM pg_notify(CASE WHEN c.status = 'cancelled' THEN 'hango_done'
                ELSE 'hango_cancel' END, c.id::text);
        END IF;
    END LOOP;
    IF st IS NULL THEN
        RAISE EXCEPTION 'run % has already finished; nothing to cancel', cancel.run_id
            USING ERRCODE = 'QH006';
    END IF;
    PERFORM pg_notify('hango_cancel', cancel.run_id::text);
    IF st = 'cancelled' THEN
        PERFORM pg_notify('hango_done', cancel.run_id::text);
    END IF;
    RETURN st;
END $fn$
"""

API_RESUME = """
CREATE FUNCTION hango_api.resume(run_id uuid, tenant text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $fn$
DECLARE t uuid := hango_tenant_id(resume.tenant);
BEGIN
    PERFORM FROM runs x WHERE x.id = resume.run_id AND x.tenant_id = t;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no run % in this tenant', resume.run_id USING ERRCODE = 'QH005';
    END IF;
    UPDATE runs x SET status = 'queued', cancel_requested = false, error = NULL,
        limit_reached = NULL, finished_at = NULL, lost_count = 0, queued_at = now(),
        lease_owner = NULL, lease_expires_at = NULL
    WHERE x.id = resume.run_id AND x.tenant_id = t AND (x.status IN ('cancelled', 'failed')
        OR (x.status = 'running' AND (x.lease_owner IS NULL OR x.lease_expires_at IS NULL)));
    IF NOT FOUND THEN
        RAISE EXCEPTION 'run % is not cancelled or failed; only those (and running runs that '
            'no worker holds) can be resumed', resume.run_id USING ERRCODE = 'QH006';
    END IF;
    PERFORM pg_notify('hango_runs', resume.run_id::text);
END $fn$
"""

# Numbers out of runs.usage only when they are numbers: a malformed row shows NULLs,
# never breaks the view for everyone.
_NUM = "CASE WHEN jsonb_typeof(r.usage->'{k}') = 'number' THEN (r.usage->'{k}')::numeric END"

# The answer: the text blocks of the run's last assistant message, once it succeeded.
RUNS_VIEW = f"""
CREATE VIEW hango_api.runs AS
SELECT r.id AS run_id, tn.name AS tenant, r.tenant_id, ag.name AS agent, r.agent_id,
    r.session_id, r.status, r.idempotency_key, r.input->>'text' AS input_text,
    r.created_at, r.started_at, r.finished_at, r.attempt,
    r.error->>'type' AS error_type, r.error->>'message' AS error_message, r.limit_reached,
    {_NUM.format(k="input_tokens")} AS input_tokens,
    {_NUM.format(k="output_tokens")} AS output_tokens,
    {_NUM.format(k="cost_usd")} AS cost_usd,
    r.usage,
    CASE WHEN r.status = 'succeeded' THEN (
        SELECT string_agg(b.value->>'text', '' ORDER BY b.ordinality)
        FROM messages m, jsonb_array_elements(CASE WHEN jsonb_typeof(m.content) = 'array'
            THEN m.content ELSE '[]'::jsonb END) WITH ORDINALITY b
        WHERE m.session_id = r.session_id AND m.seq = (
            SELECT max(m2.seq) FROM messages m2
            WHERE m2.session_id = r.session_id AND m2.run_id = r.id AND m2.role = 'assistant')
          AND b.value->>'type' = 'text'
    ) END AS result_text,
    r.parent_run_id
FROM runs r JOIN tenants tn ON tn.id = r.tenant_id JOIN agents ag ON ag.id = r.agent_id
"""

# Pin every API function's search_path to the tables' schema (then pg_temp, last).
PIN_SEARCH_PATH = """
DO $do$ DECLARE f regprocedure; BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             WHERE p.pronamespace = 'hango_api'::regnamespace LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
    END LOOP;
END $do$
"""

INTERNAL = (
    "hango_enqueue_run(text, text, jsonb, uuid, text, jsonb)",
    "hango_run_input(jsonb, jsonb)",
    "hango_tenant_id(text)",
)


def upgrade() -> None:
    op.execute(CREATE_ROLE)
    for ddl in (TENANT_ID, RUN_INPUT, ENQUEUE_RUN):
        op.execute(ddl)
    for fn in INTERNAL:
        op.execute(f"REVOKE ALL ON FUNCTION {fn} FROM PUBLIC")
    op.execute("CREATE SCHEMA hango_api")
    for ddl in (API_ENQUEUE, API_CANCEL, API_RESUME, RUNS_VIEW, PIN_SEARCH_PATH):
        op.execute(ddl)
    op.execute("COMMENT ON SCHEMA hango_api IS 'hango-worker producer API v1 (docs/producers.md)'")
    op.execute("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA hango_api FROM PUBLIC")
    op.execute(if_role(f"GRANT USAGE ON SCHEMA hango_api TO {ROLE}"))
    op.execute(if_role(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA hango_api TO {ROLE}"))
    op.execute(if_role(f"GRANT SELECT ON ALL TABLES IN SCHEMA hango_api TO {ROLE}"))


def downgrade() -> None:
    # Dropping the schema drops its functions, its view and every privilege on them; the
    # role stays (cluster-wide: other databases on this server may use it).
    op.execute("DROP SCHEMA hango_api CASCADE")
    for fn in INTERNAL:
        op.execute(f"DROP FUNCTION {fn}")
