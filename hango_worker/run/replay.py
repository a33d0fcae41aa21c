"""Replay: a recorded run driven again by the current code, with no model call.

`hango-worker replay RUN_ID` (cli/replay.py; docs/operations.md, "Change agents
safely"). The run's agent (or another one, or the run's with some fields changed) is
assembled with agent/assemble.py, as a worker assembles it, over `RecordingRunIO`
(agent/recording_io.py), a RunIO that keeps every write in memory: replay writes
nothing. The model is a
`ReplayProvider` (provider/replay.py) serving the run's recorded responses in order;
the agent's registry tools answer with their recorded results (`tool_calls`), unless
`live_tools`. Each request is compared with the fingerprint the run recorded of what it
sent (provider/fingerprint.py); the first request that differs stops the replay and is
reported with the first differing field and a readable diff.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg
from pydantic import ValidationError

from hango_worker.agent.assemble import AssemblySettings, RunParts, assemble, for_run
from hango_worker.agent.limits import RunOverrides
from hango_worker.agent.loop import RunInfo
from hango_worker.agent.middlewares.memory import TOOL_NAME as MEMORY_TOOL
from hango_worker.agent.ports import Outcome
from hango_worker.agent.recording_io import RecordingRunIO
from hango_worker.agent.spec import AgentSpec, AgentSpecError
from hango_worker.agent.state import State, load_state
from hango_worker.provider.fingerprint import (
    canonical_json,
    fingerprint,
    params_of,
    tools_of,
)
from hango_worker.provider.replay import Mismatch, RecordedCall, ReplayProvider
from hango_worker.provider.types import (
    Message,
    Request,
    Response,
    StopReason,
    Usage,
    message_from_dict,
)
from hango_worker.run.blobs import inline_blobs, inline_results
from hango_worker.run.skills import PgSkillStore
from hango_worker.store.replay import Recording, agent_row, recording
from hango_worker.tool.registry import Registry
from hango_worker.tool.types import Tool, ToolContext, ToolResult

# what --config may change in the agent: each given key replaces the agent's, but
# `config`, whose keys are laid over the agent's config
AGENT_FIELDS = ("model", "system", "tools", "config")


class ReplayError(Exception):
    """The run cannot be replayed (the message says why)."""


@dataclass(frozen=True, slots=True)
class Divergence:
    request: int  # 1-based
    field: str  # system | tools | messages | params | calls
    diff: str  # a unified diff (recorded → replay), or what could be shown
    note: str = ""


@dataclass(frozen=True, slots=True)
class ReplayReport:
    run_id: str
    requests: int  # the model requests the replay made
    recorded: int  # the model calls the run recorded
    basis: str  # "recorded": the run's own fingerprints; "rebuilt": see `replay`
    divergence: Divergence | None = None
    note: str = ""  # identical, with a caveat: both waited; compared with rebuilt requests

    @property
    def identical(self) -> bool:
        return self.divergence is None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "run_id": self.run_id,
            "result": "identical" if self.identical else "diverged",
            "requests": self.requests,
            "recorded": self.recorded,
            "basis": self.basis,
        }
        if self.note:
            d["note"] = self.note
        if self.divergence is not None:
            d.update(dataclasses.asdict(self.divergence))
        return d


@dataclass(frozen=True, slots=True)
class Pass:
    """One drive of the recording: what the provider received, how it ended."""

    provider: ReplayProvider
    outcome: Outcome


async def replay(
    pool: asyncpg.Pool,
    tenant_id: str,
    run_id: str,
    *,
    registry: Registry,
    settings: AssemblySettings,
    agent: str | None = None,
    config: Mapping[str, Any] | None = None,
    live_tools: bool = False,
) -> ReplayReport:
    """Replay run `run_id` with the run's own agent, another agent of the tenant
    (`agent`, a name or id) or the run's agent with some fields changed (`config`: any
    of AGENT_FIELDS). A run that recorded no request fingerprints (recorded before they
    were kept) is compared with the requests this code makes with the run's own agent
    (`basis` "rebuilt"). ReplayError: it cannot be replayed; NotFound: no such run."""
    rec = await recording(pool, tenant_id, run_id)
    if not rec.start:
        raise ReplayError(f"run {run_id} has no messages: it never started")
    own = _own_agent(rec, tenant_id)
    chosen = own
    if agent is not None:
        chosen = _spec(await agent_row(pool, tenant_id, agent), tenant_id, rec.run["input"])
    elif config is not None:
        chosen = _spec(_changed(rec.run, config), tenant_id, rec.run["input"])
    sent = [m.get("request") if isinstance(m, dict) else None for m in rec.model_messages]
    basis = "recorded" if all(isinstance(s, dict) for s in sent) else "rebuilt"
    drive = _Driver(pool, tenant_id, rec, registry, settings, live_tools)
    baseline: Pass | None = None
    if basis == "rebuilt":
        baseline = await drive(own, [None] * len(sent))
        rebuilt = baseline.provider.fingerprints[: len(sent)]
        sent = [*rebuilt, *[None] * (len(sent) - len(rebuilt))]
    done = await drive(chosen, sent)
    found = done.provider.divergence
    made = len(done.provider.requests)
    report = ReplayReport(run_id, made, len(rec.model_messages), basis)
    if found is None and made < len(rec.model_messages):  # it ended before the run did
        if done.outcome.status == "waiting" and made == rec.first_wait:
            note = f"the run and the replay both waited after request {made}: compared up to there"
            return dataclasses.replace(report, note=note)
        found = Mismatch(made + 1, "calls")
    if found is None:
        if basis == "rebuilt":
            note = "the run recorded no request fingerprints: compared with the requests this "
            note += "code makes for the run's own agent (a code change cannot show)"
            return dataclasses.replace(report, note=note)
        return report
    if baseline is None:
        baseline = await drive(own, [None] * len(sent))
    wanted = sent[found.request - 1] if found.request <= len(sent) else None
    div = _divergence(found.request, found.field, done, baseline, wanted, rec)
    return dataclasses.replace(report, divergence=div)


def _own_agent(rec: Recording, tenant_id: str) -> AgentSpec:
    row = {k: rec.run[k] for k in ("name", "model", "system", "tools", "config")}
    return _spec({"id": rec.run["agent_id"], **row}, tenant_id, rec.run["input"])


def _changed(run: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The run's agent row with `config`'s fields in place of its own."""
    unknown = sorted(set(config) - set(AGENT_FIELDS))
    if unknown:
        raise ReplayError(
            f"--config: unknown field(s) {', '.join(unknown)} (allowed: {', '.join(AGENT_FIELDS)})"
        )
    row = {"id": run["agent_id"], **{k: run[k] for k in ("name", *AGENT_FIELDS)}}
    for k, v in config.items():
        if k == "config":
            if not isinstance(v, dict):
                raise ReplayError("--config: 'config' must be a JSON object")
            row["config"] = {**(row["config"] or {}), **v}
        else:
            row[k] = v
    return row


def _spec(row: dict[str, Any], tenant_id: str, run_input: Any) -> AgentSpec:
    """The agent as the run sent it: its row, the run's own API parameters over it."""
    params = run_input.get("params") if isinstance(run_input, dict) else None
    try:
        spec = AgentSpec.from_row(row)
        return for_run(spec, tenant_id, params)
    except (AgentSpecError, ValueError) as e:
        raise ReplayError(f"agent {row.get('name')!r}: {e}") from None


def _overrides(run_input: Any) -> RunOverrides | None:
    raw = run_input.get("limits") if isinstance(run_input, dict) else None
    try:
        return None if raw is None else RunOverrides.model_validate(raw)
    except ValidationError as e:
        raise ReplayError(f"runs.input.limits is invalid: {e.errors()[0]['msg']}") from None


def recorded_calls(rec: Recording, agent: AgentSpec, sent: list[Any]) -> list[RecordedCall]:
    """The recorded responses, built anew for each drive (a drive's history is its own)."""
    out = []
    for i, (payload, fp) in enumerate(zip(rec.model_messages, sent, strict=True), 1):
        try:
            response = Response(
                message=message_from_dict(payload["message"]),
                stop_reason=StopReason(payload["stop_reason"]),
                usage=Usage.from_dict(payload.get("usage")),
                model=agent.model,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ReplayError(f"recorded response {i} cannot be read: {e!r}") from None
        out.append(RecordedCall(response, fp if isinstance(fp, dict) else None))
    return out


def _served(results: Mapping[str, ToolResult]) -> Any:
    """A tool function answering each call with its recorded result."""

    async def call(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        found = results.get(ctx.tool_use_id)
        if found is None:
            return ToolResult.error(f"replay: no recorded result for call {ctx.tool_use_id}")
        return found

    return call


class _Driver:
    """Drives the recording once with an agent: its start, recorded responses and tools."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        tenant_id: str,
        rec: Recording,
        registry: Registry,
        settings: AssemblySettings,
        live_tools: bool,
    ) -> None:
        self.pool, self.tenant_id, self.rec = pool, tenant_id, rec
        self.registry, self.settings, self.live_tools = registry, settings, live_tools

    async def __call__(self, agent: AgentSpec, sent: list[Any]) -> Pass:
        if MEMORY_TOOL in agent.tools:
            raise ReplayError(f"agent {agent.name!r} uses the memory tool: not replayable yet")
        provider = ReplayProvider(recorded_calls(self.rec, agent, sent))
        io = RecordingRunIO()
        tools = self.registry if self.live_tools else await self._recorded(agent)
        run = RunParts(
            started_s=time.time(),
            overrides=_overrides(self.rec.run["input"]),
            files=io,
            skills=PgSkillStore(self.pool) if agent.config.skills else None,
            depth=int(self.rec.run["depth"]),
        )
        loop = assemble(agent, provider, tools, io, run, self.settings)
        state = await self._state(agent)
        info = RunInfo(
            persisted=len(state.messages),
            turns_done=self.rec.copied_turns,
            recorded=await self._pending(state),
        )
        outcome = await loop.run(state, info)
        return Pass(provider, outcome)

    async def _state(self, agent: AgentSpec) -> State:
        """The state the run started from: its history up to its input (a fork's
        copied history), and a fork's copied state."""
        r = self.rec.run
        try:
            messages = [_message(m) for m in self.rec.start]
            await inline_blobs(self.pool, self.tenant_id, messages)
            ids = {"run_id": r["id"], "session_id": r["session_id"], "agent_id": agent.id}
            return load_state(self.rec.state, **ids, tenant_id=self.tenant_id, messages=messages)
        except (ValueError, KeyError, TypeError) as e:  # StateError is a ValueError
            raise ReplayError(f"the run's start cannot be read: {e}") from None

    async def _results(self) -> dict[str, ToolResult]:
        try:
            found = {k: ToolResult.from_dict(v) for k, v in self.rec.tool_results.items()}
            return await inline_results(self.pool, self.tenant_id, found)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ReplayError(f"a recorded tool result cannot be read: {e}") from None

    async def _pending(self, state: State) -> dict[str, ToolResult]:
        """A fork of a turn whose calls were not answered: their recorded results."""
        last = state.messages[-1] if state.messages else None
        if last is None or last.role != "assistant" or not last.tool_uses():
            return {}
        results = await self._results()
        return {u.id: results[u.id] for u in last.tool_uses() if u.id in results}

    async def _recorded(self, agent: AgentSpec) -> Registry:
        """The agent's registry tools, each answering with the recorded results."""
        fn = _served(await self._results())
        served: list[Tool] = [
            dataclasses.replace(t, call=fn) for t in self.registry.view(agent.tools)
        ]
        return Registry(served)


def _message(row: Mapping[str, Any]) -> Message:
    return message_from_dict({"role": row["role"], "content": row["content"]})


# -- the divergence, shown -------------------------------------------------------------


def _divergence(
    k: int, fld: str, done: Pass, baseline: Pass, wanted: dict[str, Any] | None, rec: Recording
) -> Divergence:
    """Request `k` differs from the recorded one at `fld`: a unified diff of that field
    between the recorded request (rebuilt: by this code with the run's own agent when
    that matches the recorded fingerprint, else, for the messages, from the stored
    history) and the replay's."""
    if fld == "calls":
        n, made = len(rec.model_messages), len(done.provider.requests)
        why = f" (it ended {done.outcome.status}: {done.outcome.error})" if made < n else ""
        return Divergence(k, fld, "", f"the replay made {made} requests{why}; the run made {n}")
    new = done.provider.requests[k - 1]
    ref = baseline.provider.requests[k - 1] if len(baseline.provider.requests) >= k else None
    exact = ref is not None and wanted is not None and _matches(ref, fld, wanted)
    if fld == "messages":
        return _messages_divergence(k, new, ref if exact else None, wanted, rec)
    before = _field_text(fld, ref) if ref is not None else []
    after = _field_text(fld, new)
    if exact:
        return Divergence(k, fld, _unified(before, after))
    if before == after:  # this code with the run's own agent sends what the replay sent
        note = f"the recorded {fld} came from other code or tools: not rebuilt; the replay's shown"
        return Divergence(k, fld, "\n".join(after), note)
    note = f"the recorded {fld} not rebuilt: diffed with this code's for the run's own agent"
    return Divergence(k, fld, _unified(before, after), note)


def _matches(request: Request, fld: str, wanted: dict[str, Any]) -> bool:
    fp = fingerprint(request)
    if fld == "messages":
        return (fp["messages"], fp["n"]) == (wanted.get("messages"), wanted.get("n"))
    return bool(fp[fld] == wanted.get(fld))


def _messages_divergence(
    k: int, new: Request, ref: Request | None, wanted: dict[str, Any] | None, rec: Recording
) -> Divergence:
    note = ""
    if ref is not None:
        before = ref.messages
    else:
        before = _stored_before(rec, k)
        probe = Request(model="", messages=before)
        if wanted is None or not _matches(probe, "messages", wanted):
            note = "the recorded messages are rebuilt from the stored history (not exactly as sent)"
    i = _first_different(before, new.messages)
    old_lines = _message_lines(before, i)
    new_lines = _message_lines(new.messages, i)
    head = f"message {i + 1} (recorded {len(before)} messages, replay {len(new.messages)})"
    return Divergence(k, "messages", head + "\n" + _unified(old_lines, new_lines), note)


def _stored_before(rec: Recording, k: int) -> list[Message]:
    """The stored history before the run's k-th model response."""
    out, seen = [], 0
    for m in rec.history:
        if m["mine"] and m["role"] == "assistant":
            seen += 1
            if seen == k:
                break
        out.append(_message(m))
    return out


def _first_different(a: list[Message], b: list[Message]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if canonical_json(x.to_dict()) != canonical_json(y.to_dict()):
            return i
    return min(len(a), len(b))


def _message_lines(messages: list[Message], i: int) -> list[str]:
    if i >= len(messages):
        return []
    return _json_lines(messages[i].to_dict())


def _field_text(fld: str, request: Request) -> list[str]:
    if fld == "system":
        lines = []
        for n, b in enumerate(request.system, 1):
            cc = f" cache_control={canonical_json(b.cache_control)}" if b.cache_control else ""
            lines.append(f"[system block {n}{cc}]")
            lines += b.text.splitlines()
        return lines
    if fld == "tools":
        return _json_lines(tools_of(request))
    return _json_lines(params_of(request))


def _json_lines(value: Any) -> list[str]:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False).splitlines()


def _unified(before: list[str], after: list[str]) -> str:
    return "\n".join(difflib.unified_diff(before, after, "recorded", "replay", lineterm=""))
