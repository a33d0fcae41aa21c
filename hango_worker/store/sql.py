"""Every hot-path statement, named, in one place (asyncpg prepared statements).

Why not SQLAlchemy here: a turn's checkpoint through SQLAlchemy Core's
AsyncEngine costs ~2 ms of client CPU against ~0.4 ms with asyncpg prepared
statements (docs/system-architecture.md, "Cost per unit of work"). Each
write that touches a run is *fenced*: it only takes effect while
`lease_owner = me AND attempt = my attempt AND status = 'running'`, and
reports whether it did — and, for free, whether a cancel was requested, so a
cancel is seen at the very next write.
"""

NOTIFY_CHANNEL = "hango_runs"
CANCEL_CHANNEL = "hango_cancel"
TEXT_CHANNEL = "hango_text"
# payload: a run id; sent (on commit) when that run reaches succeeded, failed or cancelled
DONE_CHANNEL = "hango_done"

# Counters stay far below the int4 limit: the claim never picks a run whose
# attempt is out of range (it would overflow `attempt + 1` and fail every
# claim for everyone); the sweep fails such a run with `invalid_row` instead.
ATTEMPT_LIMIT = 1_000_000_000

# jsonb comes back as text and is decoded per row in Python (run/io.py:Claim):
# a row that cannot be decoded must fail its own run, not the whole batch.
CLAIM = f"""
WITH picked AS (
    SELECT r.id FROM runs r
    WHERE r.status = 'queued' AND r.attempt >= 0 AND r.attempt < {ATTEMPT_LIMIT}
      AND NOT EXISTS (SELECT 1 FROM runs o
                      WHERE o.session_id = r.session_id AND o.status = 'running')
    ORDER BY r.created_at
    FOR UPDATE SKIP LOCKED
    LIMIT $2
)
UPDATE runs SET status = 'running', attempt = runs.attempt + 1, lease_owner = $1,
    lease_expires_at = now() + make_interval(secs => $3), started_at = coalesce(started_at, now())
FROM picked WHERE runs.id = picked.id
RETURNING runs.id::text, runs.tenant_id::text, runs.session_id::text, runs.agent_id::text,
    runs.input::text AS input, runs.state_json::text AS state_json, runs.attempt,
    runs.trace_parent, runs.cancel_requested,
    greatest(extract(epoch FROM now() - runs.queued_at), 0)::float8 AS queued_s
"""

# Give back a run claimed in the same batch as another run of its session.
UNCLAIM = """
UPDATE runs SET status = 'queued', attempt = attempt - 1,
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status = 'running'
"""

LOAD_RUN_CONTEXT = """
SELECT a.id::text AS id, a.name, a.model, a.system::text AS system, a.tools,
    a.config::text AS config,
    (SELECT coalesce(max(seq), 0) FROM messages m WHERE m.session_id = $2) AS last_seq,
    (SELECT coalesce(max(seq), 0) FROM run_events e WHERE e.run_id = $1) AS last_event_seq,
    (SELECT count(*) FROM messages m WHERE m.run_id = $1 AND m.role = 'assistant') AS turns_done,
    (SELECT count(*) FROM messages m WHERE m.run_id = $1) AS run_messages,
    (SELECT r.usage::text FROM runs r WHERE r.id = $1) AS run_usage
FROM agents a WHERE a.id = $3 AND a.tenant_id = $4
"""

LOAD_MESSAGES = (
    "SELECT seq, role, content::text AS content FROM messages WHERE session_id = $1 ORDER BY seq"
)

# The results recorded for the calls of one assistant message (the pending turn).
LOAD_TOOL_RESULTS = (
    "SELECT tool_use_id, result::text AS result FROM tool_calls "
    "WHERE run_id = $1 AND (message_seq = $2 OR message_seq IS NULL)"
)

# One statement per turn: fence + messages + events + state (+ final status).
# A NULL state leaves state_json as found (a run failed before its state was read).
CHECKPOINT = """
WITH fence AS (
    UPDATE runs SET state_json = coalesce($4::jsonb, state_json),
        queued_at = CASE WHEN $5::text = 'released' THEN now() ELSE queued_at END,
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
), done AS (
    SELECT pg_notify('hango_done', f.id::text) FROM fence f
    WHERE $5::text IN ('succeeded', 'failed', 'cancelled')
)
SELECT count(*) AS fenced, coalesce(bool_or(cancel_requested), false) AS cancel,
    (SELECT count(*) FROM done) AS notified
FROM fence
"""

# One small commit per completed tool call: result + state + its event, fenced.
# tool_calls is the resume journal, one row per (run, tool_use_id): a later turn
# that reuses an id replaces the row (tagged with its assistant message's seq);
# the same turn's second call with that id (an error result) never does.
RECORD_TOOL = """
WITH fence AS (
    UPDATE runs SET state_json = $4::jsonb, lease_expires_at = now() + make_interval(secs => $5)
    WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status = 'running'
    RETURNING id, cancel_requested
), rec AS (
    INSERT INTO tool_calls (run_id, tool_use_id, name, result, attempt, message_seq)
    SELECT f.id, $6, $7, $8::jsonb, $3, $12 FROM fence f
    ON CONFLICT (run_id, tool_use_id) DO UPDATE SET name = EXCLUDED.name,
        result = EXCLUDED.result, attempt = EXCLUDED.attempt,
        message_seq = EXCLUDED.message_seq, created_at = now()
    WHERE tool_calls.message_seq IS NULL OR tool_calls.message_seq < EXCLUDED.message_seq
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

# Runs whose worker is gone: the lease expired, or (hand-edited) a running run
# with no lease at all. Back to the queue, or failed after $1 lost leases (with
# a run_finished event). Counted in bigint so a hand-edited lost_count cannot
# overflow and stall the sweep.
RECLAIM_EXPIRED = """
WITH lost AS (
    UPDATE runs SET
        lost_count = least(lost_count::bigint + 1, 2147483647)::int,
        status = CASE WHEN lost_count::bigint + 1 >= $1 THEN 'failed' ELSE 'queued' END,
        error = CASE WHEN lost_count::bigint + 1 >= $1 THEN jsonb_build_object(
            'type', 'max_attempts', 'message', 'the run lost its worker '
            || (lost_count::bigint + 1) || ' times (lease expired); HANGO_MAX_ATTEMPTS is '
            || $1 || '; resume it once the cause is fixed') ELSE error END,
        finished_at = CASE WHEN lost_count::bigint + 1 >= $1 THEN now() ELSE NULL END,
        queued_at = CASE WHEN lost_count::bigint + 1 >= $1 THEN queued_at ELSE now() END,
        lease_owner = NULL, lease_expires_at = NULL
    WHERE status = 'running'
      AND (lease_expires_at < now() OR lease_expires_at IS NULL OR lease_owner IS NULL)
    RETURNING id, status, error, attempt
), ev AS (
    INSERT INTO run_events (run_id, seq, type, payload, worker_id, attempt)
    SELECT l.id, coalesce((SELECT max(e.seq) FROM run_events e WHERE e.run_id = l.id), 0) + 1,
        'run_finished', jsonb_build_object('status', 'failed', 'error', l.error), $2, l.attempt
    FROM lost l WHERE l.status = 'failed'
    RETURNING 1
), done AS (
    SELECT pg_notify('hango_done', l.id::text) FROM lost l WHERE l.status = 'failed'
)
SELECT id::text, status, error->>'type' AS error_type, (SELECT count(*) FROM done) AS notified
FROM lost
"""

# Queued runs the claim will never pick (a counter out of range, edited by
# hand): failed at once, with a reason naming the column, and a run_finished event.
FAIL_INVALID_ROWS = f"""
WITH bad AS (
    UPDATE runs SET status = 'failed', finished_at = now(), error = jsonb_build_object(
        'type', 'invalid_row', 'message', 'runs.attempt is ' || attempt
        || ', outside 0..{ATTEMPT_LIMIT - 1}; the row was edited by hand or is corrupt: '
        || 'set attempt to a small number, then resume the run')
    WHERE status = 'queued' AND (attempt < 0 OR attempt >= {ATTEMPT_LIMIT})
    RETURNING id, error, attempt
), ev AS (
    INSERT INTO run_events (run_id, seq, type, payload, worker_id, attempt)
    SELECT b.id, coalesce((SELECT max(e.seq) FROM run_events e WHERE e.run_id = b.id), 0) + 1,
        'run_finished', jsonb_build_object('status', 'failed', 'error', b.error), $1, NULL
    FROM bad b
    RETURNING 1
), done AS (
    SELECT pg_notify('hango_done', b.id::text) FROM bad b
)
SELECT id::text, 'failed' AS status, 'invalid_row' AS error_type,
    (SELECT count(*) FROM done) AS notified
FROM bad
"""

QUEUE_STATS = """
SELECT count(*) AS depth,
    coalesce(extract(epoch FROM now() - min(queued_at)), 0)::float8 AS oldest_age_s
FROM runs WHERE status = 'queued'
"""

NOTIFY = "SELECT pg_notify($1, $2)"
