"""Cold-path queries (CLI, client API): agents, enqueue, inspect, cancel, resume, gc.

Every query that touches a run is scoped by tenant.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg

from hango_worker.provider.content import check_input_blocks
from hango_worker.store import producer_api

DEFAULT_TENANT_ID = "00000000-0000-0000-0000-000000000001"
DEFAULT_TENANT_NAME = "default"


class NotFound(LookupError):
    pass


class Conflict(ValueError):
    pass


async def ensure_default_tenant(db: asyncpg.Pool | asyncpg.Connection) -> str:
    await db.execute(
        "INSERT INTO tenants (id, name) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        DEFAULT_TENANT_ID,
        DEFAULT_TENANT_NAME,
    )
    return DEFAULT_TENANT_ID


# Names and ids never mix (migration 0012): no tenant or agent is named like a UUID, and
# a UUID-shaped argument is always an id, anything else always a name.
UUID_SHAPED = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)


def check_new_name(what: str, name: str) -> None:
    """ValueError for a tenant or agent name shaped like a UUID (it would read as an id)."""
    if UUID_SHAPED.match(name):
        raise ValueError(
            f"a {what} name may not look like a UUID ({name!r}): names and ids would mix; "
            "choose another name"
        )


async def create_agent(
    db: asyncpg.Pool,
    *,
    tenant_id: str,
    name: str,
    model: str,
    system: list[str],
    tools: list[str],
    config: dict[str, Any],
) -> str:
    check_new_name("agent", name)
    agent_id = str(uuid.uuid4())
    try:
        await db.execute(
            "INSERT INTO agents (id, tenant_id, name, model, system, tools, config) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7)",
            agent_id,
            tenant_id,
            name,
            model,
            [{"type": "text", "text": s} for s in system],
            tools,
            config,
        )
    except asyncpg.UniqueViolationError:
        raise Conflict(f"an agent named {name!r} already exists in this tenant") from None
    return agent_id


async def list_agents(db: asyncpg.Pool, tenant_id: str) -> list[dict[str, Any]]:
    rows = await db.fetch(
        "SELECT id::text, name, model, tools, config, created_at FROM agents "
        "WHERE tenant_id = $1 ORDER BY name",
        tenant_id,
    )
    return [dict(r) for r in rows]


async def agent_config(
    db: asyncpg.Pool | asyncpg.Connection, tenant_id: str, name_or_id: str
) -> dict[str, Any]:
    """An agent's `config` (decoded here: the caller's connection may have no codecs)."""
    text = await db.fetchval(
        "SELECT config::text FROM agents WHERE tenant_id = $1::text::uuid "
        "AND (name = $2 OR id::text = $2) ORDER BY name = $2 DESC LIMIT 1",
        tenant_id,
        name_or_id,
    )
    if text is None:
        raise NotFound(f"no agent {name_or_id!r} in this tenant")
    config = json.loads(text)
    return config if isinstance(config, dict) else {}


async def find_agent(db: asyncpg.Pool, tenant_id: str, name_or_id: str) -> dict[str, Any]:
    row = await db.fetchrow(
        "SELECT id::text, name, model, system, tools, config FROM agents "
        "WHERE tenant_id = $1 AND (name = $2 OR id::text = $2)",
        tenant_id,
        name_or_id,
    )
    if row is None:
        raise NotFound(f"no agent {name_or_id!r} in this tenant")
    return dict(row)


MAX_IDEMPOTENCY_KEY = 200  # characters; keeps the unique index row small
# characters; the worker checks a run's memory key with the same rule
# (agent/middlewares/memory.py memory_key_problem) for rows written without this function
MAX_MEMORY_KEY = 200


def _check_memory_key(key: str) -> None:
    if not isinstance(key, str) or not key.strip():
        raise ValueError("a memory key must be a non-empty string")
    if len(key) > MAX_MEMORY_KEY:
        raise ValueError(f"a memory key must be 1 to {MAX_MEMORY_KEY} characters, got {len(key)}")
    if any(not ch.isprintable() for ch in key):
        raise ValueError("a memory key must not contain control or non-printable characters")


@dataclass(frozen=True, slots=True)
class Enqueued:
    """What an enqueue returns. `created` is False when an earlier enqueue with the
    same idempotency key already queued this run. `r["run_id"]` works too."""

    run_id: str
    session_id: str
    created: bool = True

    def __getitem__(self, key: str) -> str:
        if key not in ("run_id", "session_id"):
            raise KeyError(key)
        return str(getattr(self, key))


async def enqueue(
    db: asyncpg.Pool | asyncpg.Connection,
    *,
    tenant_id: str,
    agent: str,
    input_text: str,
    session_id: str | None = None,
    memory_key: str | None = None,
    priority: int = 0,
) -> dict[str, str]:
    """Queue a run (new session unless one is given); `{"run_id", "session_id"}`."""
    r = await enqueue_run(
        db,
        tenant_id=tenant_id,
        agent=agent,
        input_text=input_text,
        session_id=session_id,
        memory_key=memory_key,
        priority=priority,
    )
    return {"run_id": r.run_id, "session_id": r.session_id}


async def enqueue_run(
    db: asyncpg.Pool | asyncpg.Connection,
    *,
    tenant_id: str,
    agent: str,
    input_text: str,
    session_id: str | None = None,
    idempotency_key: str | None = None,
    limits: dict[str, Any] | None = None,
    memory_key: str | None = None,
    priority: int = 0,
    params: dict[str, Any] | None = None,
    content: list[dict[str, Any]] | None = None,
) -> Enqueued:
    """Queue a run (new session unless one is given) and wake idle workers, through
    the producer API's one implementation (`hango_enqueue_run`, docs/producers.md).

    One statement, so one round trip: find the agent, create or check the session,
    insert the run, notify (sent when it commits). On a connection inside the
    caller's transaction, the run is queued if and only if that transaction
    commits. With an idempotency key, a run already queued under that key (this
    tenant) is returned instead of a new one. `limits`: the run's own limits, already
    validated (`agent.limits.parse_overrides`), stored as `runs.input.limits`.
    `memory_key`: whose memory the run uses when its agent keeps memory per caller
    (`memory_scope` "key"), e.g. an end user. `params`: the run's own Messages API
    parameters, already checked against the agent (`agent.spec.check_run_params`),
    stored as `runs.input.params`. `content`: content blocks (images, documents,
    search results, …; docs/inputs-and-outputs.md) beside or instead of the text,
    checked against the SDK's types here and the API's limits in SQL."""
    _check_keys(session_id, idempotency_key)
    check_priority(priority)
    run_input: dict[str, Any] = {"text": input_text} if input_text else {}
    if content is not None:  # checked against the SDK's types first, for a precise line
        check_input_blocks(content)
        run_input["content"] = content
    config = _run_config(limits, memory_key, params)
    try:
        row = await db.fetchrow(
            producer_api.ENQUEUE,
            tenant_id,
            agent,
            json.dumps(run_input or {"text": input_text}, ensure_ascii=False),
            session_id,
            idempotency_key,
            None if config is None else json.dumps(config, ensure_ascii=False),
            priority,
        )
    except asyncpg.PostgresError as e:
        raise _api_error(e) from None
    if row is None:  # the function returns one row or raises
        raise RuntimeError("hango_enqueue_run returned no row")
    return Enqueued(row["run_id"], row["session_id"], created=row["created"])


MAX_PRIORITY = 1000  # runs.priority's range is 0..MAX_PRIORITY (runs_priority_check)


def check_priority(priority: int) -> None:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"a priority must be an integer, got {priority!r}")
    if not 0 <= priority <= MAX_PRIORITY:
        raise ValueError(
            f"a priority must be 0 to {MAX_PRIORITY} (higher is claimed first), got {priority}"
        )


def _check_keys(session_id: str | None, idempotency_key: str | None) -> None:
    """A session id is a UUID; an idempotency key 1 to MAX_IDEMPOTENCY_KEY characters."""
    if session_id is not None:
        try:
            uuid.UUID(session_id)
        except ValueError:
            raise NotFound(f"{session_id!r} is not a session id (a UUID)") from None
    if idempotency_key is not None and not 0 < len(idempotency_key) <= MAX_IDEMPOTENCY_KEY:
        raise ValueError(
            f"an idempotency key must be 1 to {MAX_IDEMPOTENCY_KEY} characters, "
            f"got {len(idempotency_key)}"
        )


def _run_config(
    limits: dict[str, Any] | None,
    memory_key: str | None,
    params: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The producer's per-run settings (`config` of hango_api.enqueue), checked here
    first for a precise message; stored beside the text in `runs.input`."""
    config: dict[str, Any] = {}
    if limits:
        config["limits"] = limits
    if memory_key is not None:
        _check_memory_key(memory_key)
        config["memory_key"] = memory_key
    if params is not None:
        config["params"] = params
    return config or None


def _api_error(e: Exception) -> Exception:
    """The exception a producer API error has always been in Python."""
    err = producer_api.api_error(e)
    if err is None:
        return e
    if err.sqlstate == producer_api.MALFORMED:
        return ValueError(err.message)
    if err.sqlstate == producer_api.WRONG_STATE:
        return Conflict(err.message)
    return NotFound(err.message)


# input and state_json come back as text and are decoded here: an undecodable row
# (nested too deeply, …) is shown as unreadable, never a traceback.
RUN_COLUMNS = (
    "id::text, tenant_id::text, session_id::text, agent_id::text, status, "
    "input::text AS input, state_json::text AS state_json, "
    "attempt, lease_owner, lease_expires_at, cancel_requested, error, usage, created_at, "
    "started_at, finished_at, limit_reached, waiting_for::text AS waiting_for, "
    "waiting_since, waiting_until, parent_run_id::text AS parent_run_id, parent_tool_use_id, "
    "depth, priority, output::text AS output, handed_back, lost_count"
)


async def get_run(db: asyncpg.Pool, tenant_id: str, run_id: str) -> dict[str, Any]:
    try:
        uuid.UUID(run_id)
    except ValueError:
        raise NotFound(f"{run_id!r} is not a run id (a UUID)") from None
    row = await db.fetchrow(
        f"SELECT {RUN_COLUMNS} FROM runs WHERE id = $1 AND tenant_id = $2", run_id, tenant_id
    )
    if row is None:
        raise NotFound(f"no run {run_id} in this tenant")
    run = dict(row)
    run["input"] = readable_json(run["input"])
    run["state_json"] = readable_json(run["state_json"])
    run["waiting_for"] = readable_json(run["waiting_for"])
    run["output"] = readable_json(run["output"])  # the structured answer (output_schema)
    return run


def readable_json(raw: str | None) -> Any:
    """Decode jsonb fetched as text; what cannot be decoded becomes a short note."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except RecursionError:
        return "<unreadable: nested too deeply>"
    except Exception as e:
        return f"<unreadable: {type(e).__name__}>"


async def run_details(db: asyncpg.Pool, tenant_id: str, run_id: str) -> dict[str, Any]:
    run = await get_run(db, tenant_id, run_id)
    msgs = await db.fetch(
        "SELECT seq, run_id::text, role, content::text AS content FROM messages "
        "WHERE session_id = $1 ORDER BY seq",
        run["session_id"],
    )
    events = await run_events(db, run_id, after=0)
    run["transcript"] = [{**m, "content": readable_json(m["content"])} for m in msgs]
    run["events"] = events
    run["children"] = [
        dict(r)
        for r in await db.fetch(
            "SELECT id::text, status, parent_tool_use_id FROM runs WHERE parent_run_id = $1 "
            "ORDER BY created_at",
            run_id,
        )
    ]
    return run


async def run_events(db: asyncpg.Pool, run_id: str, after: int) -> list[dict[str, Any]]:
    rows = await db.fetch(
        "SELECT seq, type, payload, worker_id, attempt, created_at FROM run_events "
        "WHERE run_id = $1 AND seq > $2 ORDER BY seq",
        run_id,
        after,
    )
    return [dict(r) for r in rows]


async def list_runs(
    db: asyncpg.Pool, tenant_id: str, *, status: str | None = None, limit: int = 50
) -> list[dict[str, Any]]:
    rows = await db.fetch(
        "SELECT r.id::text, a.name AS agent, r.status, r.attempt, r.created_at, r.finished_at, "
        "r.error FROM runs r JOIN agents a ON a.id = r.agent_id "
        "WHERE r.tenant_id = $1 AND ($2::text IS NULL OR r.status = $2) "
        "ORDER BY r.created_at DESC LIMIT $3",
        tenant_id,
        status,
        limit,
    )
    return [dict(r) for r in rows]


def _run_uuid(run_id: str) -> None:
    try:
        uuid.UUID(run_id)
    except ValueError:
        raise NotFound(f"{run_id!r} is not a run id (a UUID)") from None


async def request_cancel(db: asyncpg.Pool, tenant_id: str, run_id: str) -> str:
    """Queued runs (and running ones no worker holds) are cancelled at once; running
    ones at their next turn boundary; its subagent runs likewise, all the way down.
    The request survives a takeover: only resume clears it. `hango_api.cancel` is the
    one implementation (docs/producers.md)."""
    _run_uuid(run_id)
    try:
        return str(await db.fetchval(producer_api.CANCEL, run_id, tenant_id))
    except asyncpg.PostgresError as e:
        raise _api_error(e) from None


async def resume(db: asyncpg.Pool, tenant_id: str, run_id: str) -> None:
    """Re-queue a cancelled or failed run (or a running one no worker holds); it
    continues from its checkpoint. Clears a pending cancel request. `hango_api.resume`
    is the one implementation (docs/producers.md)."""
    _run_uuid(run_id)
    try:
        await db.execute(producer_api.RESUME, run_id, tenant_id)
    except asyncpg.PostgresError as e:
        raise _api_error(e) from None


async def run_files(db: asyncpg.Pool, tenant_id: str, run_id: str) -> list[dict[str, Any]]:
    """The run's files (`run_files`), without their content, by path."""
    await get_run(db, tenant_id, run_id)
    rows = await db.fetch(
        "SELECT path, size, tool_use_id, created_at, updated_at FROM run_files "
        "WHERE run_id = $1 ORDER BY path",
        run_id,
    )
    return [dict(r) for r in rows]


async def run_file(db: asyncpg.Pool, tenant_id: str, run_id: str, path: str) -> dict[str, Any]:
    """One run file with its content; NotFound names the run or the path."""
    await get_run(db, tenant_id, run_id)
    row = await db.fetchrow(
        "SELECT path, size, tool_use_id, created_at, updated_at, content FROM run_files "
        "WHERE run_id = $1 AND path = $2",
        run_id,
        path,
    )
    if row is None:
        raise NotFound(
            f"run {run_id} has no file {path!r} (`hango-worker runs files {run_id}` lists them)"
        )
    return dict(row)
