"""Runs as files: `hango-worker runs export` and `runs import` (docs/operations.md,
"Runs as fixtures").

An export is one JSON object, format `hango-run/1` (FORMAT), self-contained: the run's
agent, input, history, recorded responses (its `model_message` events, each with the
fingerprint of the request it answered), tool results, events, outcome, and the bytes
of every stored block it refers to (`blobs`, base64). It is read with
`store/replay.py:recording` (the reads of `hango-worker replay`) and
`store/run_export.py:extras`; `recording_of` turns a file back into that same
`Recording`, so `replay` and the test helpers (`hango_worker.testing.load_export`) read
a file as they read a database. `redact` replaces every match of the given patterns in
every string of the file with `[redacted]` (the patterns themselves are not kept).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable
from typing import Any

import asyncpg

from hango_worker.store.replay import Recording, recording
from hango_worker.store.run_export import Imported, extras, write_import
from hango_worker.tool.registry import Registry
from hango_worker.vocab import FINISHED, RunStatus

FORMAT = "hango-run/1"
REDACTED = "[redacted]"
AGENT_KEYS = ("name", "model", "system", "tools", "config")


class ExportError(ValueError):
    """The file is not an export this code reads (the message says why)."""


async def export_run(
    pool: asyncpg.Pool,
    tenant_id: str,
    run_id: str,
    redact_patterns: Iterable[str] = (),
    registry: Registry | None = None,
) -> dict[str, Any]:
    """The export of run `run_id` (NotFound: no such run in this tenant); with
    `redact_patterns` (regular expressions) redacted. `registry`: the tools installed
    here, whose definitions of the agent's tools the file carries (`tool_specs`: the
    request's tools, which a test's stand-in tools then declare)."""
    rec = await recording(pool, tenant_id, run_id)
    more = await extras(pool, tenant_id, run_id, rec.run["session_id"])
    out = more.outcome
    doc: dict[str, Any] = {
        "format": FORMAT,
        "run": {
            "id": rec.run["id"],
            "tenant_id": tenant_id,
            "status": out.get("status"),
            "depth": rec.run["depth"],
            "error": out.get("error"),
            "usage": out.get("usage"),
            "limit_reached": out.get("limit_reached"),
            "state": out.get("state"),
        },
        "agent": {k: rec.run[k] for k in AGENT_KEYS},
        "input": rec.run["input"],
        "messages": [
            {"seq": m["seq"], "role": m["role"], "content": m["content"], "mine": m["mine"]}
            for m in rec.history
        ],
        "tool_results": rec.tool_results,
        "tool_specs": [t.spec().to_dict() for t in registry.view(rec.run["tools"])]
        if registry is not None
        else [],
        "events": more.events,
        "start_state": rec.state,
        "blobs": {
            b["sha256"]: {
                "media_type": b["media_type"],
                "data": base64.b64encode(b["data"]).decode("ascii"),
            }
            for b in more.blobs
        },
    }
    patterns = list(redact_patterns)
    return redact(doc, patterns) if patterns else doc


def compile_patterns(patterns: Iterable[str]) -> list[re.Pattern[str]]:
    """ExportError naming the first pattern that is not a regular expression."""
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p))
        except re.error as e:
            raise ExportError(f"--redact {p!r}: not a regular expression: {e}") from None
    return out


def redact(doc: dict[str, Any], patterns: Iterable[str]) -> dict[str, Any]:
    """`doc` with every match of `patterns` in every string (keys and values: the
    input, messages, tool inputs and results, events, agent) replaced by REDACTED; the
    blobs' bytes are not searched. `redacted`: how many matches were replaced."""
    compiled = compile_patterns(patterns)
    count = 0

    def walk(value: Any) -> Any:
        nonlocal count
        if isinstance(value, str):
            for p in compiled:
                value, n = p.subn(REDACTED, value)
                count += n
            return value
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, dict):
            return {walk(k): walk(v) for k, v in value.items()}
        return value

    body = {k: (v if k in ("format", "blobs") else walk(v)) for k, v in doc.items()}
    return {**body, "redacted": count}


def check(doc: Any) -> dict[str, Any]:
    """`doc` if it is an export this code reads; ExportError otherwise."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise ExportError(f"not a run export of format {FORMAT!r} (format: {got!r})")
    for key, kind in (("agent", dict), ("messages", list), ("events", list), ("run", dict)):
        if not isinstance(doc.get(key), kind):
            raise ExportError(f"a run export's {key!r} must be a JSON {kind.__name__}")
    if not isinstance(doc.get("tool_results", {}), dict):
        raise ExportError("a run export's 'tool_results' must be a JSON object")
    return doc


def read_export(text: str) -> dict[str, Any]:
    try:
        return check(json.loads(text))
    except (ValueError, RecursionError) as e:
        if isinstance(e, ExportError):
            raise
        raise ExportError(f"not JSON: {e}") from None


def recording_of(doc: dict[str, Any]) -> Recording:
    """The `Recording` an export holds, as `store/replay.py:recording` reads it."""
    run = doc["run"]
    row = {
        "id": run.get("id"),
        "session_id": None,
        "agent_id": None,
        "status": run.get("status"),
        "depth": run.get("depth") or 0,
        "input": doc.get("input"),
        **{k: doc["agent"].get(k) for k in AGENT_KEYS},
    }
    events = doc["events"]
    waits = [i for i, e in enumerate(events) if e.get("type") == "run_waiting"]
    first_wait = None
    if waits:
        first_wait = sum(1 for e in events[: waits[0]] if e.get("type") == "model_message")
    return Recording(
        run=row,
        history=list(doc["messages"]),
        model_messages=[e["payload"] for e in events if e.get("type") == "model_message"],
        tool_results=dict(doc.get("tool_results") or {}),
        first_wait=first_wait,
        state=doc.get("start_state"),
    )


def _tool_names(messages: list[dict[str, Any]]) -> dict[str, str]:
    """tool_use id → the tool's name, from the history's tool_use blocks."""
    out: dict[str, str] = {}
    for m in messages:
        content = m.get("content")
        for b in content if isinstance(content, list) else []:
            if isinstance(b, dict) and b.get("type") == "tool_use":
                out[str(b.get("id"))] = str(b.get("name"))
    return out


async def import_run(pool: asyncpg.Pool, tenant_id: str, doc: dict[str, Any]) -> dict[str, str]:
    """Write an export into this database as a finished run of agent `<name>-imported`
    (created, or reused when the tenant has it), in a new session: {run_id, session_id,
    agent_id, agent}. A run exported before it finished is imported cancelled (no
    worker claims an imported run)."""
    check(doc)
    names = _tool_names(doc["messages"])
    run = doc["run"]
    run_input = _keep_user_id(doc, tenant_id)
    try:
        blobs = [
            {"sha256": k, "media_type": v["media_type"], "data": base64.b64decode(v["data"])}
            for k, v in (doc.get("blobs") or {}).items()
        ]
        imp = Imported(
            agent={k: doc["agent"][k] for k in AGENT_KEYS},
            run={**run, **_finished(run), "input": run_input},
            messages=doc["messages"],
            events=doc["events"],
            tool_results={
                k: (names.get(k, "unknown"), v) for k, v in (doc.get("tool_results") or {}).items()
            },
            blobs=blobs,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ExportError(f"a run export cannot be read: {e!r}") from None
    return await write_import(pool, tenant_id, imp)


def _keep_user_id(doc: dict[str, Any], tenant_id: str) -> Any:
    """The run's input; imported into another tenant, with the exporting tenant's id as
    `params.metadata.user_id` (what the run sent: the worker sends the tenant's id
    unless the agent or the run set one), so its requests replay identical."""
    run_input, source = doc.get("input"), doc["run"].get("tenant_id")
    if source in (None, tenant_id) or not isinstance(run_input, dict):
        return run_input
    meta = (doc["agent"].get("config") or {}).get("metadata")
    found = run_input.get("params")
    params: dict[str, Any] = found if isinstance(found, dict) else {}
    found = params.get("metadata")
    run_meta: dict[str, Any] = found if isinstance(found, dict) else {}
    if (isinstance(meta, dict) and meta.get("user_id")) or run_meta.get("user_id"):
        return run_input
    params = {**params, "metadata": {**run_meta, "user_id": source}}
    return {**run_input, "params": params}


def _finished(run: dict[str, Any]) -> dict[str, Any]:
    """The run's status and error as imported: its own when it had finished."""
    status = run.get("status")
    if status in FINISHED:
        return {}
    why = f"imported: exported while {status}"
    return {"status": RunStatus.CANCELLED, "error": {"type": "imported", "message": why}}
