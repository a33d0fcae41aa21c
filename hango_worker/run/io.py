"""PgRunIO: the loop's durability port on Postgres, every write fenced. The claim it
writes for (what the worker knows of the attempt) is run/claim.py's Claim."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import asyncpg
from opentelemetry import trace

from hango_worker.agent.control import RunControl
from hango_worker.agent.ports import ChildRun, Event, Fenced, FileInfo, Outcome
from hango_worker.agent.state import FileWrite, State, dump_state
from hango_worker.provider.types import Message, ToolUseBlock, Usage, compact_json
from hango_worker.run.blobs import store_blobs
from hango_worker.run.claim import Claim
from hango_worker.store import sql
from hango_worker.store.turn import FencedWrite, ToolWrite, TurnWrite
from hango_worker.tool.types import ToolResult

log = logging.getLogger(__name__)

T = TypeVar("T")

# Errors that mean "the database went away", not "the statement is wrong".
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ConnectionError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.InternalClientError,  # a pooled connection left mid-protocol by a lost server
    TimeoutError,
)


def _child(row: Any) -> ChildRun:
    """A child run's row as its parent sees it: its final text answer (its structured
    output as JSON text, when its agent has an output_schema), or its error."""
    if row["output"] is not None:
        return ChildRun(row["id"], row["status"], str(row["output"]))
    answer = ""
    try:
        blocks = json.loads(row["last"]) if row["last"] else []
        answer = "".join(
            str(b.get("text", ""))
            for b in blocks
            if isinstance(b, dict) and b.get("type") == "text"
        )
        error = json.loads(row["error"]) if row["error"] else None
    except (ValueError, TypeError, AttributeError):
        error = {"message": "the child run's record cannot be read"}
    err = error if isinstance(error, dict) else None
    return ChildRun(row["id"], row["status"], answer, err)


async def discard_connections(pool: asyncpg.Pool) -> None:
    """After a connection-level error, replace every idle pooled connection: they
    may be dead (server restarted) or stuck mid-protocol, and must not be reused."""
    with contextlib.suppress(Exception):
        await pool.expire_connections()


async def with_reconnect(
    op: Callable[[], Awaitable[T]],
    *,
    deadline_s: float,
    what: str,
    pool: asyncpg.Pool | None = None,
) -> T:
    """Retry `op` while Postgres is unreachable, with backoff, up to deadline_s; never
    once `pool` is closing (the worker is stopping: no retry can land, and waiting
    would hold the stop up)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + deadline_s
    delay = 0.1
    while True:
        try:
            return await op()
        except CONNECTION_ERRORS as e:
            if loop.time() + delay > until or (pool is not None and pool.is_closing()):
                raise
            log.warning("database unreachable during %s (%s); retrying in %.1fs", what, e, delay)
            if pool is not None:
                await discard_connections(pool)
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, 5.0)


def _dumps(value: Any) -> str:
    return compact_json(value)


def _usage(usage: Usage | None) -> dict[str, int] | None:
    return usage.to_dict() if usage is not None else None


def _file_args(writes: list[FileWrite]) -> tuple[list[str], list[str], list[int], list[Any]]:
    """The outbox as the four arrays the statements unnest; the newest write of a path
    wins (one statement may not insert the same key twice)."""
    last = {w.path: w for w in writes}
    ws = list(last.values())
    return (
        [w.path for w in ws],
        [w.content for w in ws],
        [w.size for w in ws],
        [w.tool_use_id for w in ws],
    )


def _traceparent() -> str | None:
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


class Writer(Protocol):
    """Where fenced writes go: a PoolWriter, or the worker's GroupCommit (run/group.py)."""

    async def fetchrow(self, query: str, *args: Any) -> Any: ...

    async def write(self, record: FencedWrite) -> Any: ...


@dataclass(slots=True)
class PoolWriter:
    """Each fenced statement straight to the pool, on its own (no group commit)."""

    pool: asyncpg.Pool

    async def fetchrow(self, query: str, *args: Any) -> Any:
        return await self.pool.fetchrow(query, *args)

    async def write(self, record: FencedWrite) -> Any:
        return await self.pool.fetchrow(sql.STATEMENT_OF[type(record)], *record.args())


class PgRunIO:
    def __init__(
        self,
        pool: asyncpg.Pool,
        claim: Claim,
        *,
        worker_id: str,
        lease_s: float,
        next_message_seq: int,
        next_event_seq: int,
        on_events: Callable[[list[dict[str, Any]]], None] | None = None,
        writer: Writer | None = None,
        control: RunControl | None = None,
    ) -> None:
        self.pool = pool
        self.writer: Writer = writer if writer is not None else PoolWriter(pool)
        self.on_events = on_events
        self.claim = claim
        self.worker_id = worker_id
        self.lease_s = lease_s
        self.control = control if control is not None else RunControl()
        self._msg_seq = next_message_seq
        # seq of the assistant message whose tool calls are being recorded: the newest
        # message written (a resumed run's pending turn is its last stored message)
        self.turn_seq = next_message_seq - 1
        self._event_seq = next_event_seq

    def _fence_args(self) -> tuple[str, str, int]:
        return (self.claim.run_id, self.worker_id, self.claim.attempt)

    async def _fenced(self, record: FencedWrite | None, query: str = "", *args: Any) -> None:
        """Write `record`, or else send `query`; raise Fenced if the lease is lost."""
        if self.control.lost:
            raise Fenced(self.claim.run_id)
        attempts = 0

        async def once() -> tuple[int, bool]:
            nonlocal attempts
            attempts += 1
            try:
                w = self.writer
                row = await (w.fetchrow(query, *args) if record is None else w.write(record))
            except asyncpg.UniqueViolationError:
                if attempts > 1:  # our earlier try committed before the connection dropped
                    return 1, False
                raise
            if row is None:  # an UPDATE … RETURNING that matched no row: fenced out
                return 0, False
            return int(row["fenced"]), bool(row["cancel"])

        n, cancel = await with_reconnect(
            once, deadline_s=self.lease_s, what="checkpoint", pool=self.pool
        )
        if n == 0:
            self.control.lost = True
            raise Fenced(self.claim.run_id)
        if cancel:
            self.control.cancel.set()

    async def checkpoint(
        self,
        state: State,
        new_messages: list[Message],
        events: list[Event],
        outcome: Outcome | None,
        usage: dict[str, Any] | None = None,
        states: list[tuple[int, str]] | None = None,
    ) -> None:
        kept = states or []
        m_seq = list(range(self._msg_seq, self._msg_seq + len(new_messages)))
        e_seq = list(range(self._event_seq, self._event_seq + len(events)))
        writes = list(state.file_writes)
        paths, contents, sizes, tool_use_ids = _file_args(writes)
        roles = [m.role for m in new_messages]
        record = TurnWrite(
            run_id=self.claim.run_id,
            owner=self.worker_id,
            attempt=self.claim.attempt,
            lease_s=self.lease_s,
            state_json=dump_state(state),
            status=outcome.status if outcome else None,
            error=outcome.error if outcome else None,
            usage=outcome.usage_dict() if outcome else usage,
            trace_parent=_traceparent(),
            limit_reached=outcome.limit if outcome else None,
            waiting=outcome.waiting if outcome else None,
            output=_dumps(outcome.output) if outcome and outcome.has_output else None,
            progressed="assistant" in roles,
            msg_seqs=m_seq,
            msg_roles=roles,
            msg_contents=[_dumps(m.stored_content()) for m in new_messages],
            ev_seqs=e_seq,
            ev_types=[e.type for e in events],
            ev_payloads=[_dumps(e.payload) for e in events],
            file_paths=paths,
            file_contents=contents,
            file_sizes=sizes,
            file_tool_use_ids=tool_use_ids,
            state_turns=[turn for turn, _ in kept],
            state_jsons=[st for _, st in kept],
        )
        await self._fenced(record)
        del state.file_writes[: len(writes)]
        await self._wake_after(outcome)
        self._msg_seq += len(new_messages)
        for seq, m in zip(m_seq, new_messages, strict=True):
            if m.role == "assistant":
                self.turn_seq = seq
        self._event_seq += len(events)
        self._published(e_seq, events)

    # -- ChildRuns: the run's subagents -------------------------------------------------

    async def _wake_after(self, outcome: Outcome | None) -> None:
        """After the commit: a child run that ended may wake its parent; a parent that
        starts waiting for children that all ended already wakes itself (sql.WAKE_PARENT)."""
        if outcome is None:
            return
        target = None
        if outcome.status in ("succeeded", "failed", "cancelled"):
            target = self.claim.parent_run_id
        elif outcome.status == "waiting" and (outcome.waiting or {}).get("reason") == "children":
            target = self.claim.run_id
        if target is not None:
            with contextlib.suppress(*CONNECTION_ERRORS):  # the sweep wakes it otherwise
                await self.pool.fetchrow(sql.WAKE_PARENT, target)

    async def child(self, tool_use_id: str) -> ChildRun | None:
        async def once() -> Any:
            return await self.pool.fetchrow(sql.CHILD_OF, self.claim.run_id, tool_use_id)

        row = await with_reconnect(once, deadline_s=self.lease_s, what="task", pool=self.pool)
        return None if row is None else _child(row)

    async def spawn(
        self, tool_use_id: str, agent: str | None, text: str, trace_parent: str | None
    ) -> ChildRun:
        """Queue the child run of call `tool_use_id` (fenced; a second spawn for the
        same call returns the child it has)."""
        if self.control.lost:
            raise Fenced(self.claim.run_id)
        args = (
            *self._fence_args(),
            agent,
            str(uuid.uuid4()),
            str(uuid.uuid4()),
            _dumps({"text": text}),
            tool_use_id,
            trace_parent,
        )
        try:
            row = await self.pool.fetchrow(sql.SPAWN_CHILD, *args)
        except asyncpg.UniqueViolationError:  # spawned before (a crash, a retry)
            found = await self.child(tool_use_id)
            if found is None:
                raise
            return found
        if int(row["fenced"]) == 0:
            self.control.lost = True
            raise Fenced(self.claim.run_id)
        if int(row["agents"]) == 0:
            why = f"there is no agent {agent!r} in this tenant to delegate to"
            return ChildRun("", "failed", error={"message": why})
        found = await self.child(tool_use_id)
        assert found is not None
        return found

    async def mark_started(self, tool_use_id: str) -> None:
        await self._fenced(None, sql.MARK_STARTED, *self._fence_args(), tool_use_id, self.lease_s)

    async def record_tool_result(
        self, state: State, call: ToolUseBlock, result: ToolResult, event: Event
    ) -> None:
        if result.blobs:  # its large blocks once, by reference (docs/inputs-and-outputs.md)
            await store_blobs(self.pool, self.claim.tenant_id, self.claim.run_id, [*result.blobs])
        writes = list(state.file_writes)
        paths, contents, sizes, tool_use_ids = _file_args(writes)
        record = ToolWrite(
            run_id=self.claim.run_id,
            owner=self.worker_id,
            attempt=self.claim.attempt,
            lease_s=self.lease_s,
            state_json=dump_state(state),
            tool_use_id=call.id,
            tool_name=call.name,
            result=result.to_dict(),
            message_seq=self.turn_seq,
            ev_seq=self._event_seq,
            ev_type=event.type,
            ev_payload=_dumps(event.payload),
            file_paths=paths,
            file_contents=contents,
            file_sizes=sizes,
            file_tool_use_ids=tool_use_ids,
        )
        await self._fenced(record)
        del state.file_writes[: len(writes)]
        self._published([self._event_seq], [event])
        self._event_seq += 1

    def _published(self, seqs: list[int], events: list[Event]) -> None:
        """Hand committed events to an in-process observer (the demo's live view)."""
        if self.on_events is not None and events:
            self.on_events(
                [
                    {"seq": q, "type": e.type, "payload": e.payload}
                    for q, e in zip(seqs, events, strict=True)
                ]
            )

    async def fail(self, error: dict[str, Any]) -> None:
        """End the run as failed before the loop could start (bad row, bad agent…).
        state_json is left as found, for the operator."""
        record = TurnWrite(
            run_id=self.claim.run_id,
            owner=self.worker_id,
            attempt=self.claim.attempt,
            lease_s=self.lease_s,
            status="failed",
            error=error,
            ev_seqs=[self._event_seq],
            ev_types=["run_finished"],
            ev_payloads=[_dumps({"status": "failed", "error": error})],
        )
        await self._fenced(record)

    # -- FileStore: the run's files, plain reads scoped by run id --------------------------

    async def get_file(self, path: str) -> str | None:
        async def once() -> str | None:
            v = await self.pool.fetchval(sql.GET_RUN_FILE, self.claim.run_id, path)
            return None if v is None else str(v)

        return await with_reconnect(once, deadline_s=self.lease_s, what="read_file", pool=self.pool)

    async def list_files(self) -> list[FileInfo]:
        async def once() -> list[FileInfo]:
            rows = await self.pool.fetch(sql.LIST_RUN_FILES, self.claim.run_id)
            return [
                FileInfo(r["path"], int(r["size"]), r["tool_use_id"], r["updated_at"]) for r in rows
            ]

        return await with_reconnect(once, deadline_s=self.lease_s, what="ls", pool=self.pool)
