"""Exported runs as test fixtures: `load_export("run.json")` (docs/operations.md,
"Runs as fixtures").

A file written by `hango-worker runs export` holds a production run: its agent, its
input and history, the model's responses and the tool results. `ExportedRun` turns it
into what a test needs to drive the run again in memory (`run_agent`) or through the
real SDK against `FakeAnthropic`::

    run = load_export("run.json")
    outcome, state, io = await run_agent(
        run.agent(), ScriptedProvider(run.script()), tools=run.tools(), state=run.state(),
        limits=run.limits(), params=run.params,
    )
    assert outcome.status == "succeeded"
    assert state.messages[-1].text() == run.final_text

`script()` is the responses as a script (ScriptedProvider's and FakeAnthropic's format,
with the recorded tool_use ids); `tools()` are the agent's tools answering with the
recorded results (pass real tools to run those instead); `provider()` is the strict
variant, `provider/replay.py:ReplayProvider`, which also checks each request against
the fingerprint recorded for it (as `hango-worker replay` does).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hango_worker.agent.limits import RunOverrides
from hango_worker.agent.middlewares.allowlist import PROVIDED_TOOLS
from hango_worker.agent.middlewares.output import TOOL_NAME as FINAL_ANSWER
from hango_worker.agent.spec import AgentSpec
from hango_worker.agent.state import State, load_state
from hango_worker.provider.content import blob_ref, inline
from hango_worker.provider.replay import ReplayProvider
from hango_worker.provider.types import Message, RawBlock, ToolResultBlock, message_from_dict
from hango_worker.run.export import read_export, recording_of
from hango_worker.run.replay import recorded_calls
from hango_worker.store.replay import Recording
from hango_worker.tool.registry import Registry
from hango_worker.tool.types import Tool, ToolContext, ToolResult

STAND_IN = "A tool of the exported run: answers each call with its recorded result."


def load_export(path: str | Path) -> ExportedRun:
    """An export file (`hango-worker runs export`); ExportError when it is not one."""
    return ExportedRun(read_export(Path(path).read_text()))


@dataclass
class ExportedRun:
    doc: dict[str, Any]

    @property
    def recording(self) -> Recording:
        return recording_of(self.doc)

    @property
    def tenant_id(self) -> str:
        return str(self.doc["run"].get("tenant_id") or "tenant-1")

    @property
    def params(self) -> dict[str, Any] | None:
        """The run's Messages API parameters (`runs.input.params`), for `run_agent`."""
        run_input = self.doc.get("input")
        found = run_input.get("params") if isinstance(run_input, dict) else None
        return found if isinstance(found, dict) else None

    def limits(self) -> RunOverrides | None:
        """The run's own limits (`runs.input.limits`), for `run_agent`."""
        run_input = self.doc.get("input")
        raw = run_input.get("limits") if isinstance(run_input, dict) else None
        return None if raw is None else RunOverrides.model_validate(raw)

    def agent(self) -> AgentSpec:
        """The run's agent, as its row was when the run was exported."""
        row = {"id": str(uuid.uuid5(uuid.NAMESPACE_URL, str(self.doc["run"].get("id")))),
               **self.doc["agent"]}  # fmt: skip
        return AgentSpec.from_row(row)

    def state(self) -> State:
        """The state the run started from: its history up to its input (the stored
        blocks' bytes put back from the file), and a fork's state."""
        rec = self.recording
        messages = [_message(m) for m in rec.start]
        _inline(messages, self.doc.get("blobs") or {})
        return load_state(
            rec.state,
            run_id=str(self.doc["run"].get("id")),
            session_id="session-1",
            agent_id=self.agent().id,
            tenant_id=self.tenant_id,
            messages=messages,
        )

    def script(self) -> list[dict[str, Any]]:
        """The recorded responses as turns of a script (ScriptedProvider, FakeAnthropic):
        each response's blocks, its tool calls with their recorded ids, its stop reason.
        A script's turn N answers a request holding N assistant messages: the turns
        before the run's first (its history's) are placeholders never played."""
        before = sum(1 for m in self.recording.start if m["role"] == "assistant")
        turns: list[dict[str, Any]] = [{"text": "(before the exported run)"}] * before
        for payload in self.recording.model_messages:
            content = payload["message"]["content"]
            calls = [b for b in content if b.get("type") == "tool_use"]
            own = [{"name": b["name"], "input": b["input"], "id": b["id"]} for b in calls]
            turns.append(
                {
                    "blocks": [b for b in content if b.get("type") != "tool_use"],
                    "tool_calls": own,
                    "stop_reason": payload.get("stop_reason"),
                }
            )
        return turns

    def provider(self) -> ReplayProvider:
        """The recorded responses in order, each request checked against the
        fingerprint recorded for it (`divergence` names the first that differs)."""
        rec = self.recording
        sent = [m.get("request") for m in rec.model_messages]
        return ReplayProvider(recorded_calls(rec, self.agent(), sent))

    def results(self) -> dict[str, ToolResult]:
        """The recorded tool results, by tool_use id (stored blocks' bytes put back)."""
        blobs = self.doc.get("blobs") or {}
        out = {}
        for k, v in (self.doc.get("tool_results") or {}).items():
            r = ToolResult.from_dict(v)
            if r.stored is not None and any(isinstance(p, dict) and blob_ref(p) for p in r.stored):
                wire = [_wired(p, blobs) for p in r.stored]
                r = ToolResult(r.content, r.is_error, r.outcome, blocks=wire)
            out[k] = r
        return out

    def tools(self, real: Sequence[Tool] = ()) -> list[Tool]:
        """The agent's tools (not the middlewares' own): `real` ones as given, the
        others answering each call with its recorded result, declared as the file's
        `tool_specs` declare them (the tools installed where it was exported), else as
        the built-in of that name, else as a stand-in taking any input."""
        given = {t.name: t for t in real}
        specs = {str(d.get("name")): d for d in self.doc.get("tool_specs") or []}
        builtins = Registry.default(load_entry_points=False)
        served = _served(self.results())
        out: list[Tool] = []
        for name in self.agent().tools:
            if name in given:
                out.append(given[name])
            elif name in PROVIDED_TOOLS or name == FINAL_ANSWER:
                continue
            elif (d := specs.get(name)) is not None:
                schema = d.get("input_schema") or {"type": "object"}
                out.append(Tool(name, str(d.get("description", "")), schema, served))
            elif (tool := builtins.get(name)) is not None:
                out.append(dataclasses.replace(tool, call=served))
            else:
                out.append(Tool(name, STAND_IN, {"type": "object"}, served, idempotent=True))
        return out

    @property
    def transcript(self) -> list[dict[str, Any]]:
        """The run's messages as stored (`role`, `content`), input and history included."""
        return [{"role": m["role"], "content": m["content"]} for m in self.doc["messages"]]

    @property
    def final_text(self) -> str:
        """The text of the run's last assistant message."""
        for m in reversed(self.doc["messages"]):
            if m["role"] == "assistant":
                return _message(m).text()
        return ""


def _message(row: dict[str, Any]) -> Message:
    return message_from_dict({"role": row["role"], "content": row["content"]})


def _wired(part: Any, blobs: dict[str, Any]) -> Any:
    ref = blob_ref(part) if isinstance(part, dict) else None
    return part if ref is None or ref not in blobs else inline(part, blobs[ref]["data"])


def _inline(messages: list[Message], blobs: dict[str, Any]) -> None:
    """Set the wire form of every stored block from the file's `blobs`."""
    for m in messages:
        for b in m.content:
            if type(b) is RawBlock and (ref := blob_ref(b.data)) in blobs:
                b.wire = inline(b.data, blobs[str(ref)]["data"])
            elif type(b) is ToolResultBlock and b.blocks is not None:
                b.wire = [_wired(p, blobs) for p in b.blocks]


def _served(results: dict[str, ToolResult]) -> Any:
    async def call(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        found = results.get(ctx.tool_use_id)
        if found is None:
            return ToolResult.error(f"export: no recorded result for call {ctx.tool_use_id}")
        return found

    return call
