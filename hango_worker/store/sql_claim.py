"""The claim and the fleet's limits, named in store/sql.py with every hot-path statement:
CLAIM (fair across tenants, priority then age, max_running per tenant and agent),
TENANT_RUNNING (the per-tenant gauge), QUEUE_CLAIMABLE (the claimable backlog, the
autoscaler's signal), RATE_TAKE / RATE_SETTLE (the fleet-wide model
rate limit, run/ratelimit.py). See docs/operations.md "Tenants, fairness and limits".
"""

# Counters stay far below the int4 limit: the claim never picks a run whose
# attempt is out of range (it would overflow `attempt + 1` and fail every
# claim for everyone); the sweep fails such a run with `invalid_row` instead.
ATTEMPT_LIMIT = 1_000_000_000

# Everything a run attempt reads to start (run/execute.py `load`): its agent, its
# session's history (as three arrays, in seq order) and the counters derived from it
# (the run's own messages are in its session: one scan of the session's messages), and
# the run's last event seq. No agent row (all NULL, or no row from LOAD_RUN): the agent
# is gone (or not the run's tenant's). `version` (the agent row's xmin) changes with
# every update of the agent: the worker keeps the parsed agent per (id, version).
# CLAIM returns it with each run it claims (one round trip for claim and load; the
# run is leased by then, so nothing else writes its session's messages).
_LOAD = """
SELECT a.id::text AS agent_row, a.xmin::text AS version, a.name, a.model,
    a.system::text AS system, a.tools, a.config::text AS config, m.last_seq, m.turns_done,
    m.run_messages, m.seqs, m.roles, m.contents,
    (SELECT coalesce(max(seq), 0) FROM run_events e WHERE e.run_id = {run}) AS last_event_seq
FROM agents a, LATERAL (
    SELECT coalesce(max(seq), 0) AS last_seq,
        count(*) FILTER (WHERE run_id = {run} AND role = 'assistant') AS turns_done,
        count(*) FILTER (WHERE run_id = {run}) AS run_messages,
        coalesce(array_agg(seq ORDER BY seq), '{{}}') AS seqs,
        coalesce(array_agg(role ORDER BY seq), '{{}}') AS roles,
        coalesce(array_agg(content::text ORDER BY seq), '{{}}') AS contents
    FROM messages WHERE session_id = {session}
) m
WHERE a.id = {agent} AND a.tenant_id = {tenant}"""

# jsonb comes back as text and is decoded per row in Python (run/io.py:Claim):
# a row that cannot be decoded must fail its own run, not the whole batch.
#
# Fair claiming (docs/operations.md "Tenants, fairness and limits"): `ring` walks the
# tenants that have queued runs in id order from a random point (a skip scan of
# runs_tenant_queue_idx, wrapping around), at most 4 x $2 of them (all of them when
# fewer have work); `heads` keeps those with a claimable run and a free slot (as this
# statement's snapshot sees it), the oldest head of queue first, at most $2; each gives
# up to $2 runs by priority then age, fewer when its max_running leaves fewer free
# (hango_claim_slots: a fresh count under a per-tenant advisory lock, so claimers on
# other workers never exceed the limit together); an agent's max_running likewise.
# A run whose agent is gone (possible only through SQL) is claimed like any other and
# failed with agent_not_found at load (run/execute.py), never left queued forever.
# The batch then takes the tenants' first runs before any tenant's second run
# (rank / weight), so a backlog delays another tenant's run by at most one batch.
# Each step of `ring` finds the next tenant once (OFFSET 0 keeps the planner from copying
# the subquery into each of its four uses, four index probes per step instead of one).
# Cost: a few index probes per tenant looked at (at most 4 x $2) and $2 rows per
# candidate tenant; independent of how many runs are queued or finished, and of how
# many tenants there are.
# The session check is a per-row probe of runs_session_idx: OFFSET 0 keeps the planner
# from turning it into a join over every running run, and `status || ''` keeps it off
# the partial indexes over running runs (runs_lease_idx, runs_tenant_running_idx),
# which it would otherwise scan whole whenever its statistics saw few runs running.
_CLAIMABLE = f"""r.status = 'queued' AND r.attempt >= 0 AND r.attempt < {ATTEMPT_LIMIT}
      AND NOT EXISTS (SELECT 1 FROM runs o WHERE o.session_id = r.session_id
                      AND o.status || '' = 'running' OFFSET 0)"""
_RUNNING_OF = "SELECT count(*) FROM runs c WHERE c.status = 'running' AND c.tenant_id = "
_NEXT_TENANT = (
    "(SELECT q.tenant_id FROM runs q WHERE q.status = 'queued' AND q.tenant_id {cmp} "
    "ORDER BY q.tenant_id LIMIT 1)"
)
_FIRST_TENANT = (
    "(SELECT q.tenant_id FROM runs q WHERE q.status = 'queued' ORDER BY q.tenant_id LIMIT 1)"
)
_CLAIMED_LOAD = _LOAD.format(
    run="k.id", session="k.session_id", agent="k.agent_id", tenant="k.tenant_id"
)
CLAIM = f"""
WITH RECURSIVE start AS MATERIALIZED (
    SELECT gen_random_uuid() AS at
), ring (tid, n, wrapped) AS (
    SELECT x.tid, 1, x.wrapped FROM start s CROSS JOIN LATERAL (
        SELECT coalesce(a.nxt, {_FIRST_TENANT}) AS tid, a.nxt IS NULL AS wrapped
        FROM (SELECT {_NEXT_TENANT.format(cmp=">= s.at")} AS nxt OFFSET 0) a
    ) x WHERE x.tid IS NOT NULL
    UNION ALL
    SELECT nx.tid, g.n + 1, nx.wrapped FROM ring g, start s CROSS JOIN LATERAL (
        SELECT coalesce(a.nxt, CASE WHEN NOT g.wrapped THEN {_FIRST_TENANT} END) AS tid,
            g.wrapped OR a.nxt IS NULL AS wrapped
        FROM (SELECT {_NEXT_TENANT.format(cmp="> g.tid")} AS nxt OFFSET 0) a
    ) nx
    WHERE g.n < least(4 * $2, 400) AND nx.tid IS NOT NULL
      AND NOT (nx.wrapped AND nx.tid >= s.at)
), heads AS MATERIALIZED (
    SELECT t.id, t.weight, t.max_running, h.created_at AS head_at
    FROM ring g JOIN tenants t ON t.id = g.tid
    CROSS JOIN LATERAL (
        SELECT r.created_at FROM runs r
        WHERE r.tenant_id = t.id AND {_CLAIMABLE}
        ORDER BY r.priority DESC, r.created_at LIMIT 1
    ) h
    WHERE t.max_running IS NULL OR t.max_running > ({_RUNNING_OF}t.id)
    ORDER BY h.created_at LIMIT $2
), slots AS MATERIALIZED (
    SELECT h.id, h.weight, h.head_at, hango_claim_slots(h.id, NULL, h.max_running) AS n
    FROM heads h
), cand AS MATERIALIZED (
    SELECT p.*, s.weight, s.head_at FROM slots s
    CROSS JOIN LATERAL (
        SELECT r.id, r.tenant_id, r.agent_id, r.priority, r.created_at, ag.max_running
        FROM runs r LEFT JOIN agents ag ON ag.id = r.agent_id  -- gone: claimed and failed
        WHERE r.tenant_id = s.id AND {_CLAIMABLE}
          AND (ag.max_running IS NULL
               OR ag.max_running > ({_RUNNING_OF}r.tenant_id AND c.agent_id = r.agent_id))
        ORDER BY r.priority DESC, r.created_at
        FOR UPDATE OF r SKIP LOCKED
        LIMIT least($2, s.n)
    ) p
), agent_slots AS MATERIALIZED (
    SELECT a.agent_id, hango_claim_slots(a.tenant_id, a.agent_id, a.max_running) AS n
    FROM (SELECT DISTINCT tenant_id, agent_id, max_running FROM cand
          WHERE max_running IS NOT NULL) a
), ranked AS (
    SELECT c.id, c.weight, c.head_at, coalesce(x.n, 2147483647) AS agent_free,
        row_number() OVER (PARTITION BY c.tenant_id ORDER BY c.priority DESC, c.created_at)
            AS tenant_rank,
        row_number() OVER (PARTITION BY c.agent_id ORDER BY c.priority DESC, c.created_at)
            AS agent_rank
    FROM cand c LEFT JOIN agent_slots x ON x.agent_id = c.agent_id
), picked AS (
    SELECT id FROM ranked WHERE agent_rank <= agent_free
    ORDER BY (tenant_rank - 1)::float8 / weight, head_at, tenant_rank
    LIMIT $2
), claimed AS (
    UPDATE runs SET status = 'running', attempt = runs.attempt + 1, lease_owner = $1,
        lease_expires_at = now() + make_interval(secs => $3),
        started_at = coalesce(started_at, now())
    FROM picked WHERE runs.id = picked.id
    RETURNING runs.id, runs.tenant_id, runs.session_id, runs.agent_id,
        runs.input::text AS input, runs.state_json::text AS state_json, runs.attempt,
        runs.trace_parent, runs.cancel_requested, runs.usage::text AS usage,
        runs.waiting_for::text AS waiting_for, runs.depth,
        runs.parent_run_id::text AS parent_run_id,
        greatest(extract(epoch FROM now() - runs.queued_at), 0)::float8 AS queued_s,
        extract(epoch FROM runs.started_at)::float8 AS started_s
)
SELECT k.id::text, k.tenant_id::text, k.session_id::text, k.agent_id::text, k.input,
    k.state_json, k.attempt, k.trace_parent, k.cancel_requested, k.usage, k.waiting_for,
    k.depth, k.parent_run_id, k.queued_s, k.started_s, ld.*
FROM claimed k LEFT JOIN LATERAL ({_CLAIMED_LOAD}) ld ON true
"""

# The claimable backlog, for the hango_queue_claimable gauge (the sweep; the autoscaler's
# signal, docs/operations.md "Autoscaling on work"): the queued runs a worker with free
# slots could claim now, by CLAIM's own rules. A run counts when _CLAIMABLE holds (queued,
# attempt in range, no other run of its session running: here one hash of the sessions
# of the running runs, not a probe per queued run), at most its agent's free slots
# (agents.max_running less the agent's running runs) and, per tenant, at most the
# tenant's free slots. Runs of a tenant at its limit, of an agent at its limit, waiting
# runs and runs whose session is busy are not counted: no worker would claim them. Rate
# limits are not known here (their key is the worker's setting): a claimable run that
# will sleep on one once claimed counts like any other.
# Cost: the running runs once (runs_lease_idx); per tenant, a probe of
# runs_tenant_running_idx when it has a limit (a tenant at its limit stops there), then
# its queued runs from runs_tenant_queue_idx (a heap visit each, at most $1 of them) and
# a probe of agents per agent with queued runs. EXPLAIN ANALYZE: 10,000 queued runs of 22
# tenants, 3 ms and 450 buffer reads; 10,000 of 2,000 tenants, 42 ms and 20,000 (about
# 10 per tenant with work). Independent of finished runs.
_CLAIMABLE_IN_BULK = f"""r.status = 'queued' AND r.attempt >= 0 AND r.attempt < {ATTEMPT_LIMIT}
                AND r.session_id NOT IN (SELECT b.session_id FROM busy b)"""
QUEUE_CLAIMABLE = f"""
WITH busy AS MATERIALIZED (
    SELECT o.session_id FROM runs o WHERE o.status = 'running'
)
SELECT coalesce(sum(least(a.n, coalesce(f.free, a.n))), 0)::bigint AS claimable
FROM tenants t
CROSS JOIN LATERAL (
    SELECT CASE WHEN t.max_running IS NOT NULL
        THEN greatest(t.max_running - ({_RUNNING_OF}t.id), 0) END AS free
    OFFSET 0
) f
CROSS JOIN LATERAL (
    SELECT sum(CASE WHEN q.max_running IS NULL THEN q.n ELSE least(q.n, greatest(
        q.max_running - ({_RUNNING_OF}t.id AND c.agent_id = q.agent_id), 0)) END) AS n
    FROM (SELECT r.agent_id, count(*) AS n,
              (SELECT ag.max_running FROM agents ag WHERE ag.id = r.agent_id) AS max_running
          FROM (SELECT r.agent_id FROM runs r
                WHERE r.tenant_id = t.id AND {_CLAIMABLE_IN_BULK} LIMIT $1) r
          GROUP BY r.agent_id) q
) a
WHERE coalesce(f.free, 1) > 0
"""

# A claimed run's start, when the claim did not bring it (a test's own claim, say):
# sql.LOAD_RUN on its own.
LOAD_RUN = _LOAD.format(run="$1", session="$2", agent="$3", tenant="$4")

# -- tenants and fleet-wide model rate limits (run/ratelimit.py; docs/operations.md
# "Tenants, fairness and limits") --------------------------------------------------------
# Running runs per tenant, for the hango_tenant_running_runs gauge (runs_tenant_running_idx).
TENANT_RUNNING = """
SELECT t.name AS tenant, count(r.id) AS running FROM tenants t
LEFT JOIN runs r ON r.tenant_id = t.id AND r.status = 'running'
GROUP BY t.name
"""

# One token bucket per key (rate_limits): each bucket refills continuously at its
# per-minute rate up to `limit * window_s / 60`; a level is as of `refilled_at`. The row
# lock (FOR UPDATE sees the latest committed level) makes a take atomic across workers.
# $1 key, $2 the call's input tokens (estimated). Granted: one request and $2 input
# tokens taken (the output bucket must not be in debt). Refused: nothing taken, and
# `wait_s` says how long until it would be granted. No row: no limit (no rows back).
# `window_s` and `rpm` come back for the gate's sanity check of a hand-edited row, `i_cap`
# (the input bucket's size) for its check that the call fits in the bucket at all: a call
# needing more than the whole bucket is never granted (the run fails, naming the key).
_LEVEL = (
    "CASE WHEN {lim} IS NULL THEN NULL ELSE least({lim} * window_s / 60.0, {col} "
    "+ greatest(extract(epoch FROM clock_timestamp() - refilled_at), 0) * {lim} / 60.0) END"
)
RATE_TAKE = f"""
WITH cur AS (
    SELECT key, clock_timestamp() AS t, blocked_until, window_s,
        requests_per_minute AS rpm, input_tokens_per_minute AS itpm,
        output_tokens_per_minute AS otpm,
        input_tokens_per_minute * window_s / 60.0 AS i_cap,
        {_LEVEL.format(lim="requests_per_minute", col="requests")} AS r,
        {_LEVEL.format(lim="input_tokens_per_minute", col="input_tokens")} AS i,
        {_LEVEL.format(lim="output_tokens_per_minute", col="output_tokens")} AS o
    FROM rate_limits WHERE key = $1 FOR UPDATE
), d AS (
    SELECT cur.*, least($2::float8, coalesce(i_cap, 0)) AS need,
        (blocked_until IS NULL OR blocked_until <= t) AND (r IS NULL OR r >= 1)
        AND (i IS NULL OR i >= least($2::float8, i_cap)) AND (o IS NULL OR o >= 0)
        AND (i_cap IS NULL OR $2::float8 <= i_cap) AS ok
    FROM cur
), u AS (
    UPDATE rate_limits l SET
        requests = coalesce(d.r - CASE WHEN d.ok THEN 1 ELSE 0 END, 0),
        input_tokens = coalesce(d.i - CASE WHEN d.ok THEN d.need ELSE 0 END, 0),
        output_tokens = coalesce(d.o, 0), refilled_at = d.t, updated_at = d.t
    FROM d WHERE l.key = d.key
    RETURNING 1
)
SELECT ok, CASE WHEN ok THEN 0 ELSE greatest(
        coalesce(extract(epoch FROM blocked_until - t), 0),
        coalesce((1 - r) * 60.0 / rpm, 0),
        coalesce((need - i) * 60.0 / itpm, 0),
        coalesce((0 - o) * 60.0 / otpm, 0), 0.001) END::float8 AS wait_s,
    (SELECT count(*) FROM u) AS taken, window_s, rpm, i_cap
FROM d
"""

# A bucket whose levels or pause were edited into nonsense (a wait no real bucket asks
# for): start it again empty, refilling from now, not paused. The limits stay.
RATE_RESET = """
UPDATE rate_limits SET requests = 0, input_tokens = 0, output_tokens = 0,
    refilled_at = clock_timestamp(), blocked_until = NULL, updated_at = clock_timestamp()
WHERE key = $1
RETURNING key
"""

# After a call: $2 input tokens beyond the estimate taken before it (may be negative),
# $3 output tokens used; what the provider said: $4/$5/$6 requests / input / output
# tokens remaining (NULL: not said; a bucket never holds more than the provider says
# is left), $7 seconds to pause every worker's calls (retry-after of a 429; NULL: none).
RATE_SETTLE = """
UPDATE rate_limits SET
    input_tokens = least(input_tokens - $2::float8, coalesce($5::float8, 'Infinity')),
    output_tokens = least(output_tokens - $3::float8, coalesce($6::float8, 'Infinity')),
    requests = least(requests, coalesce($4::float8, 'Infinity')),
    blocked_until = CASE WHEN $7::float8 IS NULL THEN blocked_until ELSE greatest(
        blocked_until, clock_timestamp() + make_interval(secs => $7::float8)) END,
    updated_at = clock_timestamp()
WHERE key = $1
"""
