"""The group commit's checkpoint statement (run/group.py), named in store/sql.py with
every hot-path statement; it is store/sql.py's CHECKPOINT for several runs at once.
"""

# A run file written again replaces the one it had (CHECKPOINT, CHECKPOINT_MANY,
# RECORD_TOOL: a run's files go with the write of the call that made them).
FILES_UPSERT = """ON CONFLICT (run_id, path) DO UPDATE SET content = EXCLUDED.content,
        size = EXCLUDED.size, tool_use_id = EXCLUDED.tool_use_id, updated_at = now()"""

# CHECKPOINT for several runs in one statement: what a group commit sends when its
# batch holds the checkpoints of two or more runs (run/group.py). Same effect, run by
# run, as one CHECKPOINT each: every run carries its own fence ($1-$3) and is reported
# on its own row (`fenced` 0: that run's lease was lost; its messages, events, files
# and states are not written, the other runs' are). Per run, $1-$11 are CHECKPOINT's
# $1-$10 and $21 (jsonb values as text), and $28 its $24 (the output); each run's rows
# ($12-$27) are tagged with its run id. One statement: one round trip, one commit, one
# executor start for the batch.
# The fence locks its rows first, found by primary key and in id order (`locked`: the
# lock order of every statement that locks several runs rows, HEARTBEAT; a plain
# UPDATE … FROM would lock them in whatever order its plan visits them, a bitmap scan's
# physical order, say). Most of what is left of its cost is the foreign-key checks of the rows it
# inserts (messages: session and run; run_events: run), about a third (EXPLAIN ANALYZE).
CHECKPOINT_MANY = f"""
WITH u AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::int[], $4::text[], $5::text[],
        $6::float8[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[],
        $28::text[])
        AS u(id, owner, attempt, state, status, lease_s, error, usage, tp, lim, waiting, output)
), locked AS (
    SELECT id FROM runs WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE
), fence AS (
    UPDATE runs r SET state_json = coalesce(u.state::jsonb, r.state_json),
        queued_at = CASE WHEN u.status = 'released' THEN now() ELSE r.queued_at END,
        lease_expires_at = CASE WHEN u.status IS NULL
                                THEN now() + make_interval(secs => u.lease_s) ELSE NULL END,
        status = CASE WHEN u.status IS NULL THEN 'running'
                      WHEN u.status = 'released' THEN 'queued' ELSE u.status END,
        lease_owner = CASE WHEN u.status IS NULL THEN r.lease_owner ELSE NULL END,
        finished_at = CASE WHEN u.status IN ('succeeded', 'failed', 'cancelled') THEN now()
                           ELSE r.finished_at END,
        error = CASE WHEN u.status IS NULL OR u.status = 'released' THEN r.error
                     ELSE u.error::jsonb END,
        usage = coalesce(u.usage::jsonb, r.usage),
        trace_parent = coalesce(u.tp, r.trace_parent),
        limit_reached = coalesce(u.lim, r.limit_reached),
        output = coalesce(u.output::jsonb, r.output),
        waiting_for = CASE WHEN u.status = 'waiting' THEN u.waiting::jsonb
                           WHEN u.status = 'released' THEN r.waiting_for ELSE NULL END,
        waiting_since = CASE WHEN u.status = 'waiting' THEN now() ELSE r.waiting_since END,
        waiting_until = CASE WHEN u.status = 'waiting'
            THEN now() + make_interval(secs => (u.waiting::jsonb->>'timeout_s')::float8) END
    FROM u, locked l
    WHERE r.id = l.id AND r.id = u.id AND r.lease_owner = u.owner
        AND r.attempt = u.attempt AND r.status = 'running'
    RETURNING r.id, r.session_id, r.cancel_requested, u.owner, u.attempt,
        u.status AS outcome
), msgs AS (
    INSERT INTO messages (session_id, seq, run_id, role, content)
    SELECT f.session_id, m.seq, f.id, m.role, m.content::jsonb
    FROM unnest($12::uuid[], $13::int[], $14::text[], $15::text[]) AS m(run, seq, role, content)
    JOIN fence f ON f.id = m.run
    RETURNING 1
), evs AS (
    INSERT INTO run_events (run_id, seq, type, payload, worker_id, attempt)
    SELECT f.id, e.seq, e.type, e.payload::jsonb, f.owner, f.attempt
    FROM unnest($16::uuid[], $17::int[], $18::text[], $19::text[]) AS e(run, seq, type, payload)
    JOIN fence f ON f.id = e.run
    RETURNING 1
), files AS (
    INSERT INTO run_files (run_id, path, content, size, tool_use_id)
    SELECT f.id, w.path, w.content, w.size, w.tool_use_id
    FROM unnest($20::uuid[], $21::text[], $22::text[], $23::int[], $24::text[])
        AS w(run, path, content, size, tool_use_id)
    JOIN fence f ON f.id = w.run
    {FILES_UPSERT}
    RETURNING 1
), snap AS (
    INSERT INTO run_states (run_id, turn, state_json)
    SELECT f.id, k.turn, k.state::jsonb
    FROM unnest($25::uuid[], $26::int[], $27::text[]) AS k(run, turn, state)
    JOIN fence f ON f.id = k.run
    ON CONFLICT (run_id, turn) DO UPDATE SET state_json = EXCLUDED.state_json
    RETURNING 1
), done AS (
    SELECT pg_notify('hango_done', f.id::text) FROM fence f
    WHERE f.outcome IN ('succeeded', 'failed', 'cancelled', 'waiting')
)
SELECT u.id::text AS id, (f.id IS NOT NULL)::int AS fenced,
    coalesce(f.cancel_requested, false) AS cancel, (SELECT count(*) FROM done) AS notified
FROM u LEFT JOIN fence f ON f.id = u.id
"""
