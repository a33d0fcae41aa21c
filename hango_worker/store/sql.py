"""Every hot-path statement, named, in one place (asyncpg prepared statements).

Why not SQLAlchemy here: a turn's checkpoint through SQLAlchemy Core's
AsyncEngine costs ~2 ms of client CPU against ~0.4 ms with asyncpg prepared
statements (DESIGN.md §11). Each write that touches a run is *fenced*: it
only takes effect while `lease_owner = me AND attempt = my attempt AND
status = 'running'`, and reports whether it did — and, for free, whether a
cancel was requested, so a cancel is seen at the very next write.
"""

NOTIFY_CHANNEL = "hango_runs"
CANCEL_CHANNEL = "hango_cancel"
TEXT_CHANNEL = "hango_text"

CLAIM = """
WITH picked AS (
    SELECT r.id FROM runs r
    WHERE r.status = 'queued'
      AND NOT EXISTS (SELECT 1 FROM runs o
                      WHERE o.session_id = r.session_id AND o.status = 'running')
    ORDER BY r.created_at
    FOR UPDATE SKIP LOCKED
    LIMIT $2
)
UPDATE runs SET status = 'running', attempt = runs.attempt + 1, lease_owner = $1,
    lease_expires_at = now() + make_interval(secs => $3), started_at = coalesce(started_at, now()),
    cancel_requested = false
FROM picked WHERE runs.id = picked.id
RETURNING runs.id::text, runs.tenant_id::text, runs.session_id::text, runs.agent_id::text,
    runs.input, runs.state_json, runs.attempt, runs.trace_parent
"""

# Give back a run claimed in the same batch as another run of its session.
UNCLAIM = """
UPDATE runs SET status = 'queued', attempt = attempt - 1,
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status = 'running'
"""

LOAD_RUN_CONTEXT = """
SELECT a.id::text AS id, a.name, a.model, a.system, a.tools, a.config,
    (SELECT coalesce(max(seq), 0) FROM messages m WHERE m.session_id = $2) AS last_seq,
    (SELECT coalesce(max(seq), 0) FROM run_events e WHERE e.run_id = $1) AS last_event_seq,
    (SELECT count(*) FROM messages m WHERE m.run_id = $1 AND m.role = 'assistant') AS turns_done,
    (SELECT count(*) FROM messages m WHERE m.run_id = $1) AS run_messages
FROM agents a WHERE a.id = $3 AND a.tenant_id = $4
"""

LOAD_MESSAGES = "SELECT seq, role, content FROM messages WHERE session_id = $1 ORDER BY seq"

LOAD_TOOL_RESULTS = "SELECT tool_use_id, result FROM tool_calls WHERE run_id = $1"

# One statement per turn: fence + messages + events + state (+ final status).
CHECKPOINT = """
WITH fence AS (
    UPDATE runs SET state_json = $4::jsonb,
        lease_expires_at = CASE WHEN $5::text IS NULL THEN now() + make_interval(secs => $6)
                                ELSE NULL END,
        status = CASE WHEN $5::text IS NULL THEN 'running'
                      WHEN $5::text = 'released' THEN 'queued' ELSE $5::text END,
        lease_owner = CASE WHEN $5::text IS NULL THEN lease_owner ELSE NULL END,
        finished_at = CASE WHEN $5::text IN ('succeeded', 'failed', 'cancelled') THEN now()
                           ELSE finished_at END,
        error = CASE WHEN $5::text IS NULL OR $5::text = 'released' THEN error ELSE $7::jsonb END,
        usage = coalesce($8::jsonb, usage),
        trace_parent = coalesce($9::text, trace_parent)
    WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status = 'running'
    RETURNING id, session_id, cancel_requested
), msgs AS (
    INSERT INTO messages (session_id, seq, run_id, role, content)
    SELECT f.session_id, m.seq, f.id, m.role, m.content::jsonb
    FROM fence f, unnest($10::int[], $11::text[], $12::text[]) AS m(seq, role, content)
    RETURNING 1
), evs AS (
    INSERT INTO run_events (run_id, seq, type, payload, worker_id, attempt)
    SELECT f.id, e.seq, e.type, e.payload::jsonb, $2, $3
    FROM fence f, unnest($13::int[], $14::text[], $15::text[]) AS e(seq, type, payload)
    RETURNING 1
)
SELECT count(*) AS fenced, coalesce(bool_or(cancel_requested), false) AS cancel FROM fence
"""

# One small commit per completed tool call: result + state + its event, fenced.
RECORD_TOOL = """
WITH fence AS (
    UPDATE runs SET state_json = $4::jsonb, lease_expires_at = now() + make_interval(secs => $5)
    WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status = 'running'
    RETURNING id, cancel_requested
), rec AS (
    INSERT INTO tool_calls (run_id, tool_use_id, name, result, attempt)
    SELECT f.id, $6, $7, $8::jsonb, $3 FROM fence f
    ON CONFLICT (run_id, tool_use_id) DO NOTHING
    RETURNING 1
), ev AS (
    INSERT INTO run_events (run_id, seq, type, payload, worker_id, attempt)
    SELECT f.id, $9, $10, $11::text::jsonb, $2, $3 FROM fence f
    RETURNING 1
)
SELECT count(*) AS fenced, coalesce(bool_or(cancel_requested), false) AS cancel FROM fence
"""

# Per worker, not per run: one statement renews every lease the worker holds.
HEARTBEAT = """
UPDATE runs SET lease_expires_at = now() + make_interval(secs => $2)
WHERE lease_owner = $1 AND status = 'running' AND id = ANY($3::uuid[])
RETURNING id::text, attempt, cancel_requested
"""

RECLAIM_EXPIRED = """
UPDATE runs SET
    lost_count = lost_count + 1,
    status = CASE WHEN lost_count + 1 >= $1 THEN 'failed' ELSE 'queued' END,
    error = CASE WHEN lost_count + 1 >= $1 THEN jsonb_build_object('type', 'max_attempts',
        'message', 'the run lost its worker ' || (lost_count + 1) || ' times (lease expired); '
        || 'HANGO_MAX_ATTEMPTS is ' || $1 || '; resume it once the cause is fixed') ELSE error END,
    finished_at = CASE WHEN lost_count + 1 >= $1 THEN now() ELSE NULL END,
    lease_owner = NULL, lease_expires_at = NULL
WHERE status = 'running' AND lease_expires_at < now()
RETURNING id::text, status
"""

QUEUE_STATS = """
SELECT count(*) AS depth,
    coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS oldest_age_s
FROM runs WHERE status = 'queued'
"""

NOTIFY = "SELECT pg_notify($1, $2)"
