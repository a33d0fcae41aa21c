"""The fenced statements of a run's two records (store/turn.py): CHECKPOINT and, for
several runs at once (the group commit, run/group.py), CHECKPOINT_MANY from a
`TurnWrite`; RECORD_TOOL from a `ToolWrite`. Named in store/sql.py with every hot-path
statement.

Each is written with named parameters (`:run_id`, the record's field names: the
`*_NAMED` texts) and compiled once, at import, into asyncpg's `$n` by the record's field order
(`turn.compile_named`): a parameter that names no field, or a field no parameter
uses, fails the import. The arguments are the record's `args()`, in the same order;
the statement of a record is STATEMENT_OF[type(record)].
"""

from hango_worker.store.turn import (
    MANY_FIELDS,
    TOOL_FIELDS,
    TURN_FIELDS,
    FencedWrite,
    ToolWrite,
    TurnWrite,
    compile_named,
)

# A run file written again replaces the one it had (CHECKPOINT, CHECKPOINT_MANY,
# RECORD_TOOL: a run's files go with the write of the call that made them).
FILES_UPSERT = """ON CONFLICT (run_id, path) DO UPDATE SET content = EXCLUDED.content,
        size = EXCLUDED.size, tool_use_id = EXCLUDED.tool_use_id, updated_at = now()"""

# One statement per turn: fence + messages + events + state (+ final status), and any
# run files still in the outbox (State.file_writes; normally flushed by RECORD_TOOL).
# A run that suspends for a person ends its attempt here too (status 'waiting', with
# `waiting`). The state at the end of a turn is kept in run_states when it changed
# (state_turns, state_jsons). A run that ends with a structured answer stores it as
# runs.output (`output`, JSON text). A NULL state leaves state_json as found (a run
# failed before its state was read).
CHECKPOINT_NAMED = f"""
WITH fence AS (
    UPDATE runs SET state_json = coalesce(:state_json::jsonb, state_json),
        queued_at = CASE WHEN :status::text = 'released' THEN now() ELSE queued_at END,
        lease_expires_at = CASE WHEN :status::text IS NULL
                                THEN now() + make_interval(secs => :lease_s) ELSE NULL END,
        status = CASE WHEN :status::text IS NULL THEN 'running'
                      WHEN :status::text = 'released' THEN 'queued' ELSE :status::text END,
        lease_owner = CASE WHEN :status::text IS NULL THEN lease_owner ELSE NULL END,
        finished_at = CASE WHEN :status::text IN ('succeeded', 'failed', 'cancelled') THEN now()
                           ELSE finished_at END,
        error = CASE WHEN :status::text IS NULL OR :status::text = 'released' THEN error
                     ELSE :error::jsonb END,
        usage = coalesce(:usage::jsonb, usage),
        trace_parent = coalesce(:trace_parent::text, trace_parent),
        limit_reached = coalesce(:limit_reached::text, limit_reached),
        output = coalesce(:output::text::jsonb, output),
        lost_count = CASE WHEN :progressed::bool THEN 0 ELSE lost_count END,
        handed_back = handed_back + CASE WHEN :status::text = 'released' THEN 1 ELSE 0 END,
        waiting_for = CASE WHEN :status::text = 'waiting' THEN :waiting::jsonb
                           WHEN :status::text = 'released' THEN waiting_for ELSE NULL END,
        waiting_since = CASE WHEN :status::text = 'waiting' THEN now() ELSE waiting_since END,
        waiting_until = CASE WHEN :status::text = 'waiting'
            THEN now() + make_interval(secs => (:waiting::jsonb->>'timeout_s')::float8) END
    WHERE id = :run_id AND lease_owner = :owner AND attempt = :attempt AND status = 'running'
    RETURNING id, session_id, cancel_requested
), msgs AS (
    INSERT INTO messages (session_id, seq, run_id, role, content)
    SELECT f.session_id, m.seq, f.id, m.role, m.content::jsonb
    FROM fence f, unnest(:msg_seqs::int[], :msg_roles::text[], :msg_contents::text[])
        AS m(seq, role, content)
    RETURNING 1
), evs AS (
    INSERT INTO run_events (run_id, seq, type, payload, worker_id, attempt)
    SELECT f.id, e.seq, e.type, e.payload::jsonb, :owner, :attempt
    FROM fence f, unnest(:ev_seqs::int[], :ev_types::text[], :ev_payloads::text[])
        AS e(seq, type, payload)
    RETURNING 1
), files AS (
    INSERT INTO run_files (run_id, path, content, size, tool_use_id)
    SELECT f.id, w.path, w.content, w.size, w.tool_use_id
    FROM fence f, unnest(:file_paths::text[], :file_contents::text[], :file_sizes::int[],
        :file_tool_use_ids::text[]) AS w(path, content, size, tool_use_id)
    {FILES_UPSERT}
    RETURNING 1
), snap AS (
    INSERT INTO run_states (run_id, turn, state_json)
    SELECT f.id, k.turn, k.state::jsonb
    FROM fence f, unnest(:state_turns::int[], :state_jsons::text[]) AS k(turn, state)
    ON CONFLICT (run_id, turn) DO UPDATE SET state_json = EXCLUDED.state_json
    RETURNING 1
), done AS (
    SELECT pg_notify('hango_done', f.id::text) FROM fence f
    WHERE :status::text IN ('succeeded', 'failed', 'cancelled', 'waiting')
)
SELECT count(*) AS fenced, coalesce(bool_or(cancel_requested), false) AS cancel,
    (SELECT count(*) FROM done) AS notified
FROM fence
"""
CHECKPOINT = compile_named(CHECKPOINT_NAMED, TURN_FIELDS)

# CHECKPOINT for several runs in one statement: what a group commit sends when its
# batch holds the checkpoints of two or more runs (run/group.py). Same effect, run by
# run, as one CHECKPOINT each: every run carries its own fence (run_id, owner,
# attempt) and is reported on its own row (`fenced` 0: that run's lease was lost; its
# messages, events, files and states are not written, the other runs' are). Each
# TurnWrite field that is one value per run is here an array of the same name, one
# element per run (jsonb values as text); each run's rows are tagged with its run id
# (msg_runs, ev_runs, file_runs, state_runs: turn.TURN_ROWS). One statement: one round
# trip, one commit, one executor start for the batch.
# The fence locks its rows first, found by primary key and in id order (`locked`: the
# lock order of every statement that locks several runs rows, HEARTBEAT; a plain
# UPDATE … FROM would lock them in whatever order its plan visits them, a bitmap scan's
# physical order, say). Most of what is left of its cost is the foreign-key checks of the rows it
# inserts (messages: session and run; run_events: run), about a third (EXPLAIN ANALYZE).
CHECKPOINT_MANY_NAMED = f"""
WITH u AS (
    SELECT * FROM unnest(:run_id::uuid[], :owner::text[], :attempt::int[],
        :state_json::text[], :status::text[], :lease_s::float8[], :error::text[],
        :usage::text[], :trace_parent::text[], :limit_reached::text[], :waiting::text[],
        :output::text[], :progressed::bool[])
        AS u(id, owner, attempt, state, status, lease_s, error, usage, tp, lim, waiting, output,
             progressed)
), locked AS (
    SELECT id FROM runs WHERE id = ANY(:run_id::uuid[]) ORDER BY id FOR UPDATE
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
        lost_count = CASE WHEN u.progressed THEN 0 ELSE r.lost_count END,
        handed_back = r.handed_back + CASE WHEN u.status = 'released' THEN 1 ELSE 0 END,
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
    FROM unnest(:msg_runs::uuid[], :msg_seqs::int[], :msg_roles::text[], :msg_contents::text[])
        AS m(run, seq, role, content)
    JOIN fence f ON f.id = m.run
    RETURNING 1
), evs AS (
    INSERT INTO run_events (run_id, seq, type, payload, worker_id, attempt)
    SELECT f.id, e.seq, e.type, e.payload::jsonb, f.owner, f.attempt
    FROM unnest(:ev_runs::uuid[], :ev_seqs::int[], :ev_types::text[], :ev_payloads::text[])
        AS e(run, seq, type, payload)
    JOIN fence f ON f.id = e.run
    RETURNING 1
), files AS (
    INSERT INTO run_files (run_id, path, content, size, tool_use_id)
    SELECT f.id, w.path, w.content, w.size, w.tool_use_id
    FROM unnest(:file_runs::uuid[], :file_paths::text[], :file_contents::text[],
        :file_sizes::int[], :file_tool_use_ids::text[])
        AS w(run, path, content, size, tool_use_id)
    JOIN fence f ON f.id = w.run
    {FILES_UPSERT}
    RETURNING 1
), snap AS (
    INSERT INTO run_states (run_id, turn, state_json)
    SELECT f.id, k.turn, k.state::jsonb
    FROM unnest(:state_runs::uuid[], :state_turns::int[], :state_jsons::text[])
        AS k(run, turn, state)
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
CHECKPOINT_MANY = compile_named(CHECKPOINT_MANY_NAMED, MANY_FIELDS)

# One small commit per completed tool call: result + state + its event, fenced.
# tool_calls is the resume journal, one row per (run, tool_use_id): a later turn
# that reuses an id replaces the row (tagged with its assistant message's seq);
# the same turn's second call with that id (an error result) never does.
# The run files the call produced (State.file_writes) go in the same statement, only
# through the fence: a worker that lost its lease writes no file.
RECORD_TOOL_NAMED = f"""
WITH fence AS (
    UPDATE runs SET state_json = :state_json::jsonb,
        lease_expires_at = now() + make_interval(secs => :lease_s)
    WHERE id = :run_id AND lease_owner = :owner AND attempt = :attempt AND status = 'running'
    RETURNING id, cancel_requested
), rec AS (
    INSERT INTO tool_calls (run_id, tool_use_id, name, result, attempt, message_seq)
    SELECT f.id, :tool_use_id, :tool_name, :result::jsonb, :attempt, :message_seq FROM fence f
    ON CONFLICT (run_id, tool_use_id) DO UPDATE SET name = EXCLUDED.name,
        result = EXCLUDED.result, attempt = EXCLUDED.attempt,
        message_seq = EXCLUDED.message_seq, created_at = now()
    WHERE tool_calls.message_seq IS NULL OR tool_calls.message_seq < EXCLUDED.message_seq
    RETURNING 1
), ev AS (
    INSERT INTO run_events (run_id, seq, type, payload, worker_id, attempt)
    SELECT f.id, :ev_seq, :ev_type, :ev_payload::text::jsonb, :owner, :attempt FROM fence f
    RETURNING 1
), files AS (
    INSERT INTO run_files (run_id, path, content, size, tool_use_id)
    SELECT f.id, w.path, w.content, w.size, w.tool_use_id
    FROM fence f, unnest(:file_paths::text[], :file_contents::text[], :file_sizes::int[],
        :file_tool_use_ids::text[]) AS w(path, content, size, tool_use_id)
    {FILES_UPSERT}
    RETURNING 1
)
SELECT count(*) AS fenced, coalesce(bool_or(cancel_requested), false) AS cancel FROM fence
"""
RECORD_TOOL = compile_named(RECORD_TOOL_NAMED, TOOL_FIELDS)

# The statement each record is written with (the group commit and PoolWriter look it up).
STATEMENT_OF: dict[type[FencedWrite], str] = {TurnWrite: CHECKPOINT, ToolWrite: RECORD_TOOL}
