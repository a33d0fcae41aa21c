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
# (or stops to wait: status waiting). Part of the producer API: producers in any language
# LISTEN on it (docs/producers.md, "Waiting for the result"); keep the name and payload.
DONE_CHANNEL = "hango_done"

# The claim (fair across tenants, max_running; docs/operations.md "Tenants, fairness
# and limits") and the fleet-wide rate-limit statements live in sql_claim.py; a run's
# two per-turn writes in sql_checkpoint.py, compiled from their records (store/turn.py:
# CHECKPOINT and, for the runs of a group commit in one statement, CHECKPOINT_MANY from
# a TurnWrite; RECORD_TOOL from a ToolWrite). They are named here like every other
# hot-path statement.
from hango_worker.store.sql_checkpoint import CHECKPOINT as CHECKPOINT  # noqa: E402
from hango_worker.store.sql_checkpoint import CHECKPOINT_MANY as CHECKPOINT_MANY  # noqa: E402
from hango_worker.store.sql_checkpoint import RECORD_TOOL as RECORD_TOOL  # noqa: E402
from hango_worker.store.sql_checkpoint import STATEMENT_OF as STATEMENT_OF  # noqa: E402
from hango_worker.store.sql_claim import ATTEMPT_LIMIT as ATTEMPT_LIMIT  # noqa: E402
from hango_worker.store.sql_claim import CLAIM as CLAIM  # noqa: E402
from hango_worker.store.sql_claim import LOAD_RUN as LOAD_RUN  # noqa: E402
from hango_worker.store.sql_claim import QUEUE_CLAIMABLE as QUEUE_CLAIMABLE  # noqa: E402
from hango_worker.store.sql_claim import RATE_RESET as RATE_RESET  # noqa: E402
from hango_worker.store.sql_claim import RATE_SETTLE as RATE_SETTLE  # noqa: E402
from hango_worker.store.sql_claim import RATE_TAKE as RATE_TAKE  # noqa: E402
from hango_worker.store.sql_claim import TENANT_RUNNING as TENANT_RUNNING  # noqa: E402

# Give back a run claimed in the same batch as another run of its session.
# A `hango_cancel` NOTIFY is only a hint (any role may send one): the worker acts on
# the row's flag, for its own attempt of the run (run/worker.py `_on_cancel`).
CANCEL_REQUESTED = (
    "SELECT cancel_requested FROM runs WHERE id = $1 AND lease_owner = $2 AND attempt = $3"
)

UNCLAIM = """
UPDATE runs SET status = 'queued', attempt = attempt - 1,
    lease_owner = NULL, lease_expires_at = NULL
WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status = 'running'
"""

# The results recorded for the calls of one assistant message (the pending turn).
LOAD_TOOL_RESULTS = (
    "SELECT tool_use_id, result::text AS result FROM tool_calls "
    "WHERE run_id = $1 AND (message_seq = $2 OR message_seq IS NULL)"
)

# The decisions a person made for the calls of the pending turn (a run resumed after
# waiting; read only then).
LOAD_DECISIONS = (
    "SELECT tool_use_id, decision, input::text AS input, text FROM run_decisions "
    "WHERE run_id = $1 AND message_seq = $2"
)

# A call of a batch resumed after a wait is about to start: take it off the list of
# calls not started, so a later attempt answers it as interrupted (never runs it twice).
MARK_STARTED = """
UPDATE runs SET waiting_for = CASE
        WHEN jsonb_typeof(waiting_for->'not_started') = 'array' THEN
            jsonb_set(waiting_for, '{not_started}', coalesce(
                (SELECT jsonb_agg(x) FROM jsonb_array_elements(waiting_for->'not_started') x
                 WHERE x <> to_jsonb($4::text)), '[]'::jsonb))
        ELSE waiting_for END,
    lease_expires_at = now() + make_interval(secs => $5)
WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status = 'running'
RETURNING 1 AS fenced, cancel_requested AS cancel
"""

# Per worker, not per run: one statement renews every lease the worker holds.
# The rows are locked in primary-key order (ORDER BY id FOR UPDATE), as a group commit
# locks its runs (run/group.py): the plan's own order (runs_lease_idx) deadlocked with
# group commits now and then.
HEARTBEAT = """
WITH mine AS (
    SELECT id FROM runs
    WHERE lease_owner = $1 AND status = 'running' AND id = ANY($3::uuid[])
    ORDER BY id FOR UPDATE
)
UPDATE runs r SET lease_expires_at = now() + make_interval(secs => $2)
FROM mine WHERE r.id = mine.id
RETURNING r.id::text, r.attempt, r.cancel_requested
"""

# Shutdown (run/worker.py `_hand_back`): the attempts a stopping worker gave up on
# (cancelled after the grace) go back to the queue now, not when their lease expires,
# and other workers are told. Not a lost lease: lost_count is unchanged. Fenced like
# every write: this worker's lease, this attempt, still running.
HAND_BACK = """
WITH h AS (
    UPDATE runs r SET status = 'queued', queued_at = now(),
        lease_owner = NULL, lease_expires_at = NULL, handed_back = r.handed_back + 1
    FROM unnest($2::uuid[], $3::int[]) AS b(id, attempt)
    WHERE r.id = b.id AND r.attempt = b.attempt AND r.lease_owner = $1
      AND r.status = 'running'
    RETURNING r.id
)
SELECT h.id::text, pg_notify('hango_runs', h.id::text) FROM h
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

# Reads of one run's files (the Filesystem middleware's FileStore).
GET_RUN_FILE = "SELECT content FROM run_files WHERE run_id = $1 AND path = $2"
LIST_RUN_FILES = (
    "SELECT path, size, tool_use_id, updated_at FROM run_files WHERE run_id = $1 ORDER BY path"
)

QUEUE_STATS = """
SELECT count(*) AS depth,
    coalesce(extract(epoch FROM now() - min(queued_at)), 0)::float8 AS oldest_age_s,
    (SELECT count(*) FROM runs WHERE status = 'waiting') AS waiting,
    (SELECT coalesce(extract(epoch FROM now() - min(waiting_since)), 0)::float8
     FROM runs WHERE status = 'waiting') AS waiting_oldest_s
FROM runs WHERE status = 'queued'
"""

# Waiting runs past their approval timeout (runs_waiting_idx): by the agent's
# on_approval_timeout, the pending call is answered "timed out" and the run re-queued
# (reject), or the run fails with approval_timeout (fail). A record without a call id
# is re-queued without a decision: the resumed run asks again, nothing stalls.
EXPIRE_WAITING = """
WITH due AS (
    SELECT id, waiting_for, (waiting_for->>'on_timeout' = 'fail') AS fail FROM runs
    WHERE status = 'waiting' AND waiting_until < now()
    ORDER BY waiting_until FOR UPDATE SKIP LOCKED LIMIT 100
), dec AS (
    INSERT INTO run_decisions (run_id, message_seq, tool_use_id, decision, text, decided_by)
    SELECT d.id, (SELECT max(m.seq) FROM messages m WHERE m.run_id = d.id
                  AND m.role = 'assistant'),
        d.waiting_for->'call'->>'tool_use_id', 'timeout', 'no decision in time', $1
    FROM due d WHERE NOT coalesce(d.fail, false)
        AND d.waiting_for->'call'->>'tool_use_id' IS NOT NULL
    ON CONFLICT DO NOTHING
    RETURNING 1
), upd AS (
    UPDATE runs r SET
        status = CASE WHEN d.fail THEN 'failed' ELSE 'queued' END,
        error = CASE WHEN d.fail THEN jsonb_build_object('type', 'approval_timeout',
            'message', 'no decision within the approval timeout ('
            || coalesce(d.waiting_for->>'timeout_s', '?') || ' s, approval_timeout_s)')
            ELSE r.error END,
        finished_at = CASE WHEN d.fail THEN now() ELSE NULL END,
        queued_at = CASE WHEN d.fail THEN r.queued_at ELSE now() END,
        waiting_until = NULL
    FROM due d WHERE r.id = d.id
    RETURNING r.id, r.status, r.error
), ev AS (
    INSERT INTO run_events (run_id, seq, type, payload, worker_id)
    SELECT u.id, coalesce((SELECT max(e.seq) FROM run_events e WHERE e.run_id = u.id), 0) + 1,
        CASE WHEN u.status = 'failed' THEN 'run_finished' ELSE 'decision' END,
        CASE WHEN u.status = 'failed' THEN jsonb_build_object('status', 'failed', 'error', u.error)
             ELSE jsonb_build_object('decision', 'timeout', 'by', $1) END, $1
    FROM upd u
    RETURNING 1
), done AS (
    SELECT pg_notify(CASE WHEN u.status = 'failed' THEN 'hango_done' ELSE 'hango_runs' END,
        u.id::text) FROM upd u
)
SELECT u.id::text AS id, u.status, (SELECT count(*) FROM done) AS notified FROM upd u
"""

NOTIFY = "SELECT pg_notify($1, $2)"

# A `task` call's child run (a subagent), fenced by the parent's lease; one child per
# call (runs_parent_call_idx: a second spawn for a call fails, and the caller reads the
# child it has). The child's traceparent puts its spans in the parent's trace.
SPAWN_CHILD = """
WITH fence AS (
    SELECT id, tenant_id, agent_id, depth FROM runs
    WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status = 'running'
), ag AS (
    SELECT a.id FROM agents a, fence f
    WHERE a.tenant_id = f.tenant_id AND (($4::text IS NULL AND a.id = f.agent_id) OR a.name = $4)
), sess AS (
    INSERT INTO sessions (id, tenant_id, agent_id)
    SELECT $5, f.tenant_id, ag.id FROM fence f, ag
    RETURNING id
), child AS (
    INSERT INTO runs (id, tenant_id, session_id, agent_id, input, parent_run_id,
                      parent_tool_use_id, depth, trace_parent)
    SELECT $6, f.tenant_id, s.id, ag.id, $7::text::jsonb, f.id, $8, f.depth + 1, $9
    FROM fence f, ag, sess s
    RETURNING id
), wake AS (
    SELECT pg_notify('hango_runs', c.id::text) FROM child c
)
SELECT (SELECT count(*) FROM fence) AS fenced, (SELECT count(*) FROM ag) AS agents,
    (SELECT count(*) FROM child) AS created, (SELECT count(*) FROM wake) AS notified
"""

CHILD_OF = """
SELECT r.id::text AS id, r.status, r.error::text AS error,
    (SELECT m.content::text FROM messages m WHERE m.run_id = r.id AND m.role = 'assistant'
     ORDER BY m.seq DESC LIMIT 1) AS last, r.output::text AS output
FROM runs r WHERE r.parent_run_id = $1 AND r.parent_tool_use_id = $2
"""

# After a child run's final checkpoint commits (and after a parent's own checkpoint
# into waiting for children): the parent goes back to the queue once none of its
# children still runs. Run after the commit, each in its own snapshot, so of two
# children ending at once (or a child ending as its parent starts to wait) the later
# statement sees both ends: no wake-up is lost.
WAKE_PARENT = """
WITH w AS (
    UPDATE runs p SET status = 'queued', queued_at = now()
    WHERE p.id = $1 AND p.status = 'waiting' AND p.waiting_for->>'reason' = 'children'
      AND NOT EXISTS (SELECT 1 FROM runs c WHERE c.parent_run_id = p.id
                      AND c.status NOT IN ('succeeded', 'failed', 'cancelled'))
    RETURNING p.id
), n AS (SELECT pg_notify('hango_runs', w.id::text) FROM w)
SELECT (SELECT count(*) FROM w) AS woken, (SELECT count(*) FROM n) AS notified
"""

# The sweep's fallback for waking parents (two children ending at once may each see
# the other still running): every parent waiting for children none of which runs.
WAKE_PARENTS = """
WITH w AS (
    UPDATE runs p SET status = 'queued', queued_at = now()
    WHERE p.status = 'waiting' AND p.waiting_for->>'reason' = 'children'
      AND NOT EXISTS (SELECT 1 FROM runs c WHERE c.parent_run_id = p.id
                      AND c.status NOT IN ('succeeded', 'failed', 'cancelled'))
    RETURNING p.id
), n AS (SELECT pg_notify('hango_runs', w.id::text) FROM w)
SELECT (SELECT count(*) FROM w) AS woken, (SELECT count(*) FROM n) AS notified
"""

# -- long-term memory (agent/middlewares/memory.py; docs/design.md §12) ---------------------------
# Every write is ONE statement: the run's fence (which also renews its lease, like
# RECORD_TOOL) and the file's version condition together, so a worker that lost its
# lease writes nothing and a stale edit never overwrites a newer one. Each returns
# `fenced` (0: lease lost), `cancel`, `written` (the new version; NULL: nothing written)
# and `current` (the version found before the statement; NULL: no such file).
# Parameters: $1 run, $2 worker, $3 attempt, $4 lease_s, $5 tenant, $6 agent,
# $7 scope, $8 scope key, $9 path, then the write's own.
_MEMORY_FENCE = """
WITH fence AS (
    UPDATE runs SET lease_expires_at = now() + make_interval(secs => $4)
    WHERE id = $1 AND lease_owner = $2 AND attempt = $3 AND status = 'running'
    RETURNING id, cancel_requested
)"""
_MEMORY_KEY = "tenant_id = $5 AND agent_id = $6 AND scope = $7 AND scope_key = $8"
_MEMORY_RESULT = f"""
SELECT (SELECT count(*) FROM fence) AS fenced,
    coalesce((SELECT bool_or(cancel_requested) FROM fence), false) AS cancel,
    (SELECT version FROM w) AS written,
    (SELECT version FROM memories WHERE {_MEMORY_KEY} AND path = $9) AS current
"""

# $10 content, $11 size in bytes, $12 tool_use_id. Creates only: an existing path wins.
MEMORY_CREATE = f"""{_MEMORY_FENCE}, w AS (
    INSERT INTO memories (tenant_id, agent_id, scope, scope_key, path, content, size, version,
        run_id, tool_use_id)
    SELECT $5, $6, $7, $8, $9, $10, $11, 1, f.id, $12 FROM fence f
    ON CONFLICT DO NOTHING
    RETURNING version
){_MEMORY_RESULT}"""

# $10 new path (= $9 unless renaming), $11 content, $12 size, $13 the version the edit
# was made on, $14 tool_use_id. A rename onto an existing path raises a unique violation.
MEMORY_UPDATE = f"""{_MEMORY_FENCE}, w AS (
    UPDATE memories m SET path = $10, content = $11, size = $12, version = m.version + 1,
        run_id = f.id, tool_use_id = $14, updated_at = now()
    FROM fence f
    WHERE m.tenant_id = $5 AND m.agent_id = $6 AND m.scope = $7 AND m.scope_key = $8
      AND m.path = $9 AND m.version = $13
    RETURNING m.version
){_MEMORY_RESULT}"""

# $10 the version the delete was decided on.
MEMORY_DELETE = f"""{_MEMORY_FENCE}, w AS (
    DELETE FROM memories m USING fence f
    WHERE m.tenant_id = $5 AND m.agent_id = $6 AND m.scope = $7 AND m.scope_key = $8
      AND m.path = $9 AND m.version = $10
    RETURNING 0 AS version
){_MEMORY_RESULT}"""

# Reads are not fenced (they write nothing). $5 a path prefix ('' = all), $6 a row limit.
MEMORY_INDEX = """
SELECT path, size, version FROM memories
WHERE tenant_id = $1 AND agent_id = $2 AND scope = $3 AND scope_key = $4
  AND left(path, char_length($5::text)) = $5::text
ORDER BY path LIMIT $6
"""
# Which of $5 (paths) are files: a path below a file may not be made (a memory path is a
# file or a directory, never both).
MEMORY_FILES_AMONG = """
SELECT path FROM memories
WHERE tenant_id = $1 AND agent_id = $2 AND scope = $3 AND scope_key = $4
  AND path = ANY($5::text[])
ORDER BY path
"""
MEMORY_READ = """
SELECT content, version FROM memories
WHERE tenant_id = $1 AND agent_id = $2 AND scope = $3 AND scope_key = $4 AND path = $5
"""

# -- Agent Skills (run/skills.py): the latest version of each enabled skill, per attempt --
SKILLS_LATEST = """
SELECT DISTINCT ON (name) name, version, description, body, files FROM skills
WHERE tenant_id = $1 AND name = ANY($2::text[])
ORDER BY name, version DESC
"""

# -- a fleet on one database (docs/scaling.md) -----------------------------------------------------
# The claim runs on a connection of its own with these settings. Planned from stale
# statistics (a burst into a queue that was empty at the last ANALYZE: the usual case),
# CLAIM's `picked` became a bitmap scan of *every* queued run, each checked against the
# running runs, then sorted: O(queue depth) per claim, ~8,000 buffer reads at a depth of
# 1,000. Without bitmap scans the plans left walk the queue indexes in order and stop at
# the LIMIT, whatever the statistics say (the fair claim of sql_claim.py walks
# runs_tenant_queue_idx per tenant). A generic plan (force_generic_plan), planned once
# per connection (asyncpg prepares and caches the statement): custom plans re-planned
# CLAIM on every claim, and planning alone grew with the queue's depth (EXPLAIN of one
# tenant's queue: 4 ms at 1,000 queued runs, 8.6 ms at 100,000), while the plan, generic
# or not, reads the same index paths at both depths (~190 vs ~250 buffers, one more
# B-tree level) and executes in ~2 ms (bench/claim.py).
CLAIM_SESSION_SETTINGS = {"enable_bitmapscan": "off", "plan_cache_mode": "force_generic_plan"}

# The live text of every run with news since the last flush (run/stream.py): one
# statement and one transaction per flush, not one per run. Sent in array order.
NOTIFY_MANY = "SELECT count(pg_notify($1, p)) FROM unnest($2::text[]) AS p"
