"""Executing one claimed run: load, build the stack, drive the loop."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol

import asyncpg
from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, TraceFlags
from pydantic import ValidationError

from hango_worker.agent.assemble import (
    AssemblySettings,
    RunParts,
    assemble,
    attempt_mcp,
    for_run,
    memory_binding,
)
from hango_worker.agent.control import RunControl
from hango_worker.agent.limits import RunOverrides
from hango_worker.agent.loop import AgentLoop, RunInfo
from hango_worker.agent.middlewares.hitl import DecisionRecord
from hango_worker.agent.middlewares.memory import MemoryBinding, MemoryScopeError
from hango_worker.agent.ports import Outcome
from hango_worker.agent.spec import AgentSpec, AgentSpecError
from hango_worker.agent.state import StateError, load_state
from hango_worker.config import ConfigError, Settings
from hango_worker.provider.prices import PriceTable
from hango_worker.provider.types import Message, Provider, message_from_dict
from hango_worker.run.blobs import PgFileIds, inline_blobs, inline_results, input_message
from hango_worker.run.budget import BudgetDirectory, RunBudgetGate
from hango_worker.run.claim import Claim, decode_json
from hango_worker.run.io import CONNECTION_ERRORS, PgRunIO, Writer
from hango_worker.run.memory import PgMemoryStore
from hango_worker.run.providers import platform_of, provider_for
from hango_worker.run.ratelimit import RunRateGate
from hango_worker.run.skills import PgSkillStore
from hango_worker.run.stream import TextPublisher
from hango_worker.store import sql
from hango_worker.tool.mcp_client import McpTools
from hango_worker.tool.registry import Registry
from hango_worker.tool.types import ToolResult
from hango_worker.vocab import Decision, ErrorType

log = logging.getLogger(__name__)


class RunObserver(Protocol):
    """In-process view of runs (the demo's live view). Called per text delta and
    after each committed write, so both must be cheap and must not block."""

    def delta(self, run_id: str, text: str) -> None: ...

    def events(self, run_id: str, events: list[dict[str, Any]]) -> None: ...


@dataclass(slots=True)
class Loaded:
    agent: AgentSpec
    messages: list[Message]
    persisted: int
    turns_done: int
    recorded: dict[str, ToolResult]
    next_message_seq: int
    next_event_seq: int
    overrides: RunOverrides | None = None  # runs.input.limits
    decisions: dict[str, DecisionRecord] = field(default_factory=dict)  # after a wait


class LoadError(Exception):
    def __init__(self, type: str, message: str) -> None:
        super().__init__(message)
        self.error = {"type": type, "message": message}


def _why(e: Exception) -> str:
    return str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"


async def load(pool: asyncpg.Pool, c: Claim) -> Loaded:
    """Everything a run attempt needs. A row that cannot be decoded or read raises
    LoadError naming it (invalid_input, invalid_agent, invalid_history, …)."""
    if c.invalid is not None:
        raise LoadError(c.invalid["type"], c.invalid["message"])
    ctx = c.start
    c.start = None  # read once
    if ctx is None:
        ctx = await pool.fetchrow(sql.LOAD_RUN, c.run_id, c.session_id, c.agent_id, c.tenant_id)
    if ctx is None or ctx["agent_row"] is None:
        raise LoadError(
            ErrorType.AGENT_NOT_FOUND, f"agent {c.agent_id} of run {c.run_id} does not exist"
        )
    agent = _agent(ctx, c.tenant_id)
    if isinstance(c.input, dict) and c.input.get("params") is not None:
        agent = _with_run_params(agent, c.input["params"], c.tenant_id)
    rows = [_Row(*r) for r in zip(ctx["seqs"], ctx["roles"], ctx["contents"], strict=True)]
    messages = _messages(rows)
    persisted = len(messages)
    if ctx["run_messages"] == 0:
        try:
            messages.append(input_message(c.input))
        except (ValueError, KeyError, TypeError) as e:
            raise LoadError(ErrorType.INVALID_INPUT, _why(e)) from None
    try:
        await inline_blobs(pool, c.tenant_id, messages)
    except ValueError as e:
        raise LoadError(ErrorType.INVALID_HISTORY, str(e)) from None
    overrides = _overrides(c.input)
    recorded: dict[str, ToolResult] = {}
    if rows and rows[-1].role == "assistant":  # a pending turn: its recorded results
        recorded = _recorded(await pool.fetch(sql.LOAD_TOOL_RESULTS, c.run_id, rows[-1].seq))
        try:
            recorded = await inline_results(pool, c.tenant_id, recorded)
        except ValueError as e:
            raise LoadError(ErrorType.INVALID_TOOL_RESULT, str(e)) from None
    decisions: dict[str, DecisionRecord] = {}
    if c.waiting_for is not None and rows and rows[-1].role == "assistant":
        found = await pool.fetch(sql.LOAD_DECISIONS, c.run_id, rows[-1].seq)
        decisions = _decisions(found, messages[persisted - 1])
    return Loaded(
        agent=agent,
        messages=messages,
        persisted=persisted,
        turns_done=int(ctx["turns_done"]),
        recorded=recorded,
        next_message_seq=int(ctx["last_seq"]) + 1,
        next_event_seq=int(ctx["last_event_seq"]) + 1,
        overrides=overrides,
        decisions=decisions,
    )


def _overrides(run_input: Any) -> RunOverrides | None:
    """A producer's limits for this run (`runs.input.limits`), validated."""
    raw = run_input.get("limits") if isinstance(run_input, dict) else None
    if raw is None:
        return None
    try:
        return RunOverrides.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        raise LoadError(
            ErrorType.INVALID_INPUT, f"runs.input.limits is invalid at {loc}: {err['msg']}"
        ) from None


def _with_run_params(agent: AgentSpec, params: Any, tenant_id: str) -> AgentSpec:
    """The agent with the run's own Messages API parameters (`runs.input.params`) laid
    over its config, checked again here (the SQL API stores them unchecked)."""
    try:
        return for_run(agent, tenant_id, params)
    except ValueError as e:
        raise LoadError(ErrorType.INVALID_INPUT, f"runs.input.params: {e}") from None


def _decisions(rows: list[Any], pending: Message) -> dict[str, DecisionRecord]:
    """The decisions for the pending turn's calls, each tied to its call (name, input)."""
    calls = {u.id: u for u in pending.tool_uses()}
    out = {}
    for r in rows:
        call = calls.get(str(r["tool_use_id"]))
        if call is None:
            continue
        try:
            edited = decode_json(r["input"], "run_decisions.input")
            if edited is not None and not isinstance(edited, dict):
                raise ValueError("run_decisions.input must be a JSON object")
            out[call.id] = DecisionRecord(
                Decision(r["decision"]), call.name, call.input, edited, r["text"]
            )
        except ValueError as e:
            raise LoadError(
                ErrorType.INVALID_STATE, f"the decision for call {call.id!r}: {_why(e)}"
            ) from None
    return out


# Parsed agents by (id, row version): an agent row is immutable until it is updated,
# which gives it a new version. Bounded: emptied when full.
_AGENTS: dict[tuple[str, str], AgentSpec] = {}
MAX_CACHED_AGENTS = 1024


def _agent(ctx: Any, tenant_id: str) -> AgentSpec:
    """The parsed agent, with the tenant's id as `metadata.user_id` unless its config sets
    one (an agent belongs to one tenant, so the cached spec carries it)."""
    key = (str(ctx["agent_row"]), str(ctx["version"]))
    found = _AGENTS.get(key)
    if found is None:
        row = {k: ctx[k] for k in ("name", "model", "system", "tools", "config")}
        found = _parse_agent({"id": ctx["agent_row"], **row})
        found = for_run(found, tenant_id)
        if len(_AGENTS) >= MAX_CACHED_AGENTS:
            _AGENTS.clear()
        _AGENTS[key] = found
    return found


def _parse_agent(row: dict[str, Any]) -> AgentSpec:
    try:
        row["system"] = decode_json(row["system"], "agents.system")
        row["config"] = decode_json(row["config"], "agents.config")
        return AgentSpec.from_row(row)
    except AgentSpecError as e:
        raise LoadError(ErrorType.INVALID_AGENT, str(e)) from None
    except Exception as e:
        raise LoadError(ErrorType.INVALID_AGENT, f"agent {row.get('name')!r}: {_why(e)}") from None


class _Row(NamedTuple):
    """One stored message of the session, as sql.LOAD_RUN returns it."""

    seq: int
    role: str
    content: str


def _messages(rows: list[_Row]) -> list[Message]:
    messages = []
    for r in rows:
        try:
            content = decode_json(r.content, "messages.content")
            messages.append(message_from_dict({"role": r.role, "content": content}))
        except Exception as e:
            raise LoadError(
                ErrorType.INVALID_HISTORY,
                f"session history cannot be read: message seq {r.seq}: {_why(e)}",
            ) from None
    return messages


def _recorded(rows: list[Any]) -> dict[str, ToolResult]:
    out = {}
    for r in rows:
        try:
            d = decode_json(r["result"], "tool_calls.result")
            if not (
                isinstance(d, dict)
                and isinstance(d.get("content", ""), str)
                and isinstance(d.get("is_error", False), bool)
            ):
                raise ValueError("must be an object {content: string, is_error: boolean}")
            out[str(r["tool_use_id"])] = ToolResult.from_dict(d)
        except Exception as e:
            raise LoadError(
                ErrorType.INVALID_TOOL_RESULT,
                f"the recorded result of tool call {r['tool_use_id']!r} cannot be read: {_why(e)}",
            ) from None
    return out


def _previous_attempt(c: Claim) -> tuple[Any, list[Link]]:
    """Parent context and link from the previous attempt's traceparent: one trace per run."""
    if not c.trace_parent:
        return None, []
    try:
        _, trace_id, span_id, flags = c.trace_parent.split("-")
        sc = SpanContext(int(trace_id, 16), int(span_id, 16), True, TraceFlags(int(flags, 16)))
    except ValueError:
        return None, []
    parent = trace.set_span_in_context(NonRecordingSpan(sc))
    return parent, [Link(sc, {"hango.link": "previous_attempt"})]


@dataclass(slots=True)
class RunDeps:
    pool: asyncpg.Pool
    settings: Settings
    registry: Registry
    provider: Provider
    worker_id: str
    observer: RunObserver | None = None
    text: TextPublisher | None = None
    writer: Writer | None = None  # the worker's GroupCommit (run/group.py); None: the pool
    budgets: BudgetDirectory = field(default_factory=BudgetDirectory)  # run/budget.py


def run_control(deps: RunDeps, c: Claim) -> RunControl:
    """A claimed run's control state: the worker keeps it, its PgRunIO carries it."""
    s = deps.settings
    control = RunControl(
        retries=s.model_retries,
        rate_gate=RunRateGate(deps.pool, s.rate_limit_key) if s.rate_limit_key else None,
        rate_wait_s=c.rate_wait_s,  # the earlier attempts' waits
    )
    if c.cancel_requested:  # requested before a takeover: it survives the claim
        control.cancel.set()
    control.budget_gate = RunBudgetGate(
        deps.pool,
        deps.budgets,
        price_table(s),
        control,
        c.run_id,
        c.attempt,
        c.tenant_id,
        c.agent_id,
    )
    return control


def _io(deps: RunDeps, c: Claim, control: RunControl, message_seq: int, event_seq: int) -> PgRunIO:
    obs = deps.observer
    return PgRunIO(
        deps.pool,
        c,
        worker_id=deps.worker_id,
        lease_s=deps.settings.lease_s,
        next_message_seq=message_seq,
        next_event_seq=event_seq,
        on_events=(lambda evs: obs.events(c.run_id, evs)) if obs else None,
        writer=deps.writer,
        control=control,
    )


async def execute(deps: RunDeps, c: Claim, control: RunControl) -> Outcome | None:
    """Run one claimed attempt to its end. Fenced (lease lost) → None, nothing written.
    A run that cannot be loaded fails at once with the reason (this run only)."""
    try:
        loaded = await load(deps.pool, c)
    except LoadError as e:
        return await fail_run(deps, c, control, e.error)
    except CONNECTION_ERRORS:
        raise  # the database is away: the lease expires and the run is retried
    except Exception as e:
        log.exception("loading the run failed", extra={"run_id": c.run_id})
        error = {
            "type": ErrorType.INTERNAL_ERROR,
            "message": f"the run could not be loaded: {_why(e)}",
        }
        return await fail_run(deps, c, control, error)
    io = _io(deps, c, control, loaded.next_message_seq, loaded.next_event_seq)
    try:
        state = load_state(
            c.state_json,
            run_id=c.run_id,
            session_id=c.session_id,
            agent_id=c.agent_id,
            tenant_id=c.tenant_id,
            messages=loaded.messages,
        )
    except StateError as e:
        await io.fail({"type": ErrorType.INVALID_STATE, "message": str(e)})
        return Outcome("failed", {"type": ErrorType.INVALID_STATE, "message": str(e)})
    try:
        memory = _memory(deps, loaded.agent, c, io)
    except MemoryScopeError as e:
        await io.fail({"type": ErrorType.INVALID_INPUT, "message": str(e)})
        return Outcome("failed", {"type": ErrorType.INVALID_INPUT, "message": str(e)})
    try:  # the agent's platform (provider/platforms.py): a client it cannot have fails it
        provider = provider_for(deps.provider, loaded.agent, deps.settings, control)
    except ConfigError as e:
        await io.fail({"type": ErrorType.INVALID_INPUT, "message": str(e)})
        return Outcome("failed", {"type": ErrorType.INVALID_INPUT, "message": str(e)})
    parent, links = _previous_attempt(c)
    info = RunInfo(
        attempt=c.attempt,
        turns_done=loaded.turns_done,
        recorded=loaded.recorded,
        persisted=loaded.persisted,
        usage=c.usage,
        not_started=frozenset((c.waiting_for or {}).get("not_started", [])),
        cost_before=c.cost_before,
        unpriced_before=c.unpriced_before,
        parent=parent,
        links=links,
        span_attributes=_span_attributes(deps, c),
    )
    async with attempt_mcp(loaded.agent) as mcp:  # closed when the attempt ends
        loop = _build_loop(deps, loaded, c, io, memory, mcp, provider)
        return await loop.run(state, info)


def _span_attributes(deps: RunDeps, c: Claim) -> dict[str, Any]:
    attrs: dict[str, Any] = {"hango.run.attempt": c.attempt, "hango.worker.id": deps.worker_id}
    params = c.input.get("params") if isinstance(c.input, dict) else None
    if isinstance(params, dict) and params:  # the run's own API parameters: their names
        attrs["hango.run.params"] = sorted(params)
    return attrs


async def fail_run(deps: RunDeps, c: Claim, control: RunControl, error: dict[str, Any]) -> Outcome:
    """End the claimed run as failed with `error` (fenced; a `run_finished` event)."""
    io = _io(deps, c, control, 0, await _next_event_seq(deps.pool, c))
    await io.fail(error)
    return Outcome("failed", error)


async def _next_event_seq(pool: asyncpg.Pool, c: Claim) -> int:
    v = await pool.fetchval(
        "SELECT coalesce(max(seq), 0) FROM run_events WHERE run_id = $1", c.run_id
    )
    return int(v) + 1


def _memory(deps: RunDeps, agent: AgentSpec, c: Claim, io: PgRunIO) -> MemoryBinding | None:
    """The run's memory store and scope, when its agent lists the memory tool."""
    return memory_binding(
        agent,
        lambda: PgMemoryStore(deps.pool, io),
        tenant_id=c.tenant_id,
        session_id=c.session_id,
        memory_key=c.input.get("memory_key") if isinstance(c.input, dict) else None,
    )


_prices: list[tuple[Settings, PriceTable]] = []  # the last settings' table (read-only)


def price_table(s: Settings) -> PriceTable:
    """The default prices with HANGO_MODEL_PRICES laid over them, made once per settings
    object (a worker's settings are the same object run after run)."""
    if _prices and _prices[0][0] is s:
        return _prices[0][1]
    table = PriceTable({m: p.model_dump() for m, p in s.model_prices.items()})
    _prices[:] = [(s, table)]
    return table


_assembly: list[tuple[Settings, AssemblySettings]] = []  # the last settings' (read-only)


def assembly_settings(s: Settings) -> AssemblySettings:
    """The worker's defaults for every run's assembly (agent/assemble.py), made once per
    settings object (a worker's settings are the same object run after run)."""
    if _assembly and _assembly[0][0] is s:
        return _assembly[0][1]
    made = AssemblySettings(
        max_turns=s.max_turns,
        repeat_call_threshold=s.repeat_call_threshold,
        capture_content=s.capture_content,
        prices=price_table(s),
    )
    _assembly[:] = [(s, made)]
    return made


def _build_loop(
    deps: RunDeps,
    loaded: Loaded,
    c: Claim,
    io: PgRunIO,
    memory: MemoryBinding | None,
    mcp: McpTools | None,
    provider: Provider,
) -> AgentLoop:
    agent, run_id, obs, pub = loaded.agent, c.run_id, deps.observer, deps.text
    run = RunParts(
        started_s=c.started_s,
        overrides=loaded.overrides,
        files=io,
        memory=memory,
        skills=PgSkillStore(deps.pool) if agent.config.skills else None,
        children=io,
        decisions=loaded.decisions,
        depth=c.depth,
        blob_files=PgFileIds(deps.pool, c.tenant_id) if agent.config.files_api else None,
    )

    def on_text(delta: str) -> None:
        if obs is not None:
            obs.delta(run_id, delta)
        if pub is not None:
            pub.add(run_id, delta)

    settings = assembly_settings(deps.settings)
    platform = platform_of(deps.provider, agent, deps.settings)
    if platform != "anthropic":  # the platform's prices (provider/prices.py)
        settings = replace(settings, prices=settings.prices.on_platform(platform))
    return assemble(agent, provider, deps.registry, io, run, settings, on_text, mcp=mcp)
