"""The Python client: enqueue runs and follow them from your own code.

async with Client.connect(dsn) as client:
    r = await client.enqueue(agent="support", input="Where is my order?",
                             idempotency_key="order-1234-question")
    run = await client.wait(r.run_id)

Inside your own transaction (the run is queued if and only if it commits):

async with conn.transaction():
    await conn.execute("INSERT INTO orders …")
    await enqueue(conn, agent="support", input="New order 1234")

Enqueue, cancel and resume go through the producer SQL API's functions, the same ones
producers in other languages call (docs/producers.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from hango_worker.agent.limits import parse_overrides
from hango_worker.store import db, decisions, fork, repo, run_stream, tenants
from hango_worker.store.json_limits import check_json
from hango_worker.store.sql import DONE_CHANNEL, TEXT_CHANNEL
from hango_worker.vocab import FINISHED, Decision, RunStatus

EnqueueResult = repo.Enqueued
StreamEvent = run_stream.StreamEvent


async def enqueue(
    conn: asyncpg.Connection | asyncpg.Pool,
    *,
    agent: str,
    input: str = "",
    session_id: str | None = None,
    idempotency_key: str | None = None,
    tenant_id: str = repo.DEFAULT_TENANT_ID,
    limits: Mapping[str, Any] | None = None,
    memory_key: str | None = None,
    priority: int = 0,
    params: Mapping[str, Any] | None = None,
    content: Sequence[Mapping[str, Any]] | None = None,
) -> EnqueueResult:
    """Queue a run on the caller's connection (any asyncpg connection, no codecs
    needed): inside the caller's transaction it is queued iff that commits.
    `limits`: this run's own limits (max_turns, max_input_tokens, max_output_tokens,
    max_tool_calls, tool_call_limits, max_duration_s, deadline); ValueError if invalid.
    `priority`: 0 (default) to 1000; within the tenant, higher is claimed first.
    JSON nested more than 64 levels deep, or holding a NUL: ValueError, nothing queued.
    `params`: Messages API parameters for this run's model calls (thinking,
    stop_sequences, metadata, service_tier, output_config, …), laid over the agent's
    config; ValueError (one line) if the merged config is refused, nothing queued.
    `content`: content blocks (images, documents, search results, …) beside or instead
    of `input` (docs/inputs-and-outputs.md); ValueError, one line, if refused."""
    if limits is not None:
        check_json(limits, "limits")
    if content is not None:
        check_json(list(content), "content")
    run_params = None
    if params is not None:
        from hango_worker.agent.spec import check_run_params

        check_json(params, "params")
        config = await repo.agent_config(conn, tenant_id, agent)
        run_params = check_run_params(config, params)
    return await repo.enqueue_run(
        conn,
        tenant_id=tenant_id,
        agent=agent,
        input_text=input,
        session_id=session_id,
        idempotency_key=idempotency_key,
        limits=parse_overrides(dict(limits)) if limits is not None else None,
        memory_key=memory_key,
        priority=priority,
        params=run_params,
        content=None if content is None else [dict(b) for b in content],
    )


class Client:
    def __init__(self, pool: asyncpg.Pool, tenant_id: str = repo.DEFAULT_TENANT_ID) -> None:
        self.pool = pool
        self.tenant_id = tenant_id

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, dsn: str, tenant_id: str = repo.DEFAULT_TENANT_ID, *, tenant: str | None = None
    ) -> AsyncIterator[Client]:
        """`tenant`: a tenant's name or id (NotFound if there is none; see
        `hango-worker tenants create`); else `tenant_id` (default: the default tenant)."""
        pool = await db.create_pool(dsn, min_size=1, max_size=4)
        try:
            if tenant is not None:
                tenant_id = await tenants.resolve_tenant(pool, tenant)
            yield cls(pool, tenant_id)
        finally:
            await pool.close()

    async def create_agent(
        self,
        name: str,
        model: str,
        *,
        system: list[str] | None = None,
        tools: list[str] | None = None,
        config: dict[str, Any] | None = None,
    ) -> str:
        """A new agent in the client's tenant; ValueError for a bad name or config
        (config nested more than 64 levels deep, or holding a NUL, included)."""
        from hango_worker.agent.spec import AgentConfig

        if config is not None:
            check_json(config, "config")
        cfg = AgentConfig.model_validate(config or {}).model_dump(exclude_none=True)
        await repo.ensure_default_tenant(self.pool)
        return await repo.create_agent(
            self.pool,
            tenant_id=self.tenant_id,
            name=name,
            model=model,
            system=system or [],
            tools=tools or [],
            config=cfg,
        )

    async def enqueue(
        self,
        agent: str,
        input: str = "",
        session_id: str | None = None,
        *,
        idempotency_key: str | None = None,
        conn: asyncpg.Connection | None = None,
        limits: Mapping[str, Any] | None = None,
        memory_key: str | None = None,
        priority: int = 0,
        params: Mapping[str, Any] | None = None,
        content: Sequence[Mapping[str, Any]] | None = None,
    ) -> EnqueueResult:
        """Queue a run. `priority`: 0-1000, higher is claimed first within the tenant.
        `params`: Messages API parameters for this run (see `enqueue`).
        `content`: content blocks beside or instead of `input`.
        `idempotency_key`: a second enqueue with the same key returns
        the first run (`created=False`). `conn`: enqueue on your connection, inside
        your transaction. `memory_key`: whose memory the run uses when its agent keeps
        memory per caller (`memory_scope` "key"), e.g. your end user's id."""
        return await enqueue(
            conn if conn is not None else self.pool,
            agent=agent,
            input=input,
            session_id=session_id,
            idempotency_key=idempotency_key,
            tenant_id=self.tenant_id,
            limits=limits,
            memory_key=memory_key,
            priority=priority,
            params=params,
            content=content,
        )

    async def get(self, run_id: str) -> dict[str, Any]:
        """The run's record, transcript and events; `output`: its parsed final answer
        when its agent has an output_schema (docs/structured-output.md), else None."""
        return await repo.run_details(self.pool, self.tenant_id, run_id)

    async def cancel(self, run_id: str) -> str:
        return await repo.request_cancel(self.pool, self.tenant_id, run_id)

    async def resume(self, run_id: str) -> None:
        await repo.resume(self.pool, self.tenant_id, run_id)

    async def approve(
        self, run_id: str, call_id: str | None = None, input: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Approve the call the waiting run waits on (`input`: run it with these
        arguments instead); the run is queued again. NotFound / Conflict otherwise;
        ValueError: `input` nested more than 64 levels deep or holding a NUL."""
        if input is not None:
            check_json(input, "input")
        return await decisions.decide(
            self.pool,
            self.tenant_id,
            run_id,
            Decision.APPROVE,
            call_id=call_id,
            edited=input,
            decided_by="client",
        )

    async def reject(self, run_id: str, reason: str, call_id: str | None = None) -> dict[str, Any]:
        """Reject the pending call: the model gets an error result carrying `reason`."""
        return await decisions.decide(
            self.pool,
            self.tenant_id,
            run_id,
            Decision.REJECT,
            call_id=call_id,
            text=reason,
            decided_by="client",
        )

    async def answer(self, run_id: str, text: str, call_id: str | None = None) -> dict[str, Any]:
        """Answer the question (`ask_user`) the waiting run asks."""
        return await decisions.decide(
            self.pool,
            self.tenant_id,
            run_id,
            Decision.ANSWER,
            call_id=call_id,
            text=text,
            decided_by="client",
        )

    async def fork(self, run_id: str, at_turn: int, input: str | None = None) -> dict[str, str]:
        """A new queued run from the end of `run_id`'s turn `at_turn` (its history and
        state as they were then; `input`: the user's next message). The source run is
        only read. ValueError: no such turn."""
        return await fork.fork(self.pool, self.tenant_id, run_id, at_turn, input)

    async def history(self, run_id: str) -> list[dict[str, Any]]:
        """The run's turns: index, time, tool calls, whether the state changed."""
        return await fork.history(self.pool, self.tenant_id, run_id)

    async def stream(
        self, run_id: str, last_event_id: str | None = None
    ) -> AsyncIterator[StreamEvent]:
        """The run's events, the same stream as the HTTP API's `/v1/runs/{id}/events`
        (docs/http-api.md): durable events (`id` "<seq>") and live text deltas (`id`
        "<seq>.<n>", event "text_delta"), after `last_event_id` if given, until the
        last one, `end` with the run's final status. NotFound: no such run."""
        q: asyncio.Queue[tuple[int, str]] = asyncio.Queue(1000)

        def on_text(conn: object, pid: int, channel: str, payload: str) -> None:
            with contextlib.suppress(ValueError, KeyError, TypeError, asyncio.QueueFull):
                msg = json.loads(payload)
                if msg["run_id"] == run_id:
                    q.put_nowait((int(msg["offset"]), str(msg["text"])))

        async with self.pool.acquire() as conn:
            await conn.add_listener(TEXT_CHANNEL, on_text)
            try:
                async for e in run_stream.events(
                    self.pool, self.tenant_id, run_id, q, last_event_id
                ):
                    yield e
            finally:
                await conn.remove_listener(TEXT_CHANNEL, on_text)

    async def wait(
        self, run_id: str, timeout_s: float = 300.0, poll_s: float = 5.0
    ) -> dict[str, Any]:
        """Until the run has finished or waits for a person (status `waiting` for an
        approval or an answer; a run waiting for its subagents is still working): woken by
        its `hango_done` notification; a slow
        poll (`poll_s`) is the fallback should a notification be missed."""
        done = asyncio.Event()

        def on_done(conn: object, pid: int, channel: str, payload: str) -> None:
            if payload == run_id:
                done.set()

        async with asyncio.timeout(timeout_s), self.pool.acquire() as conn:
            await conn.add_listener(DONE_CHANNEL, on_done)
            try:
                while True:  # listening before the first read: no wake-up is lost
                    run = await repo.get_run(self.pool, self.tenant_id, run_id)
                    if run["status"] in FINISHED or _waits_for_a_person(run):
                        return await self.get(run_id)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(done.wait(), poll_s)
                    done.clear()
            finally:
                await conn.remove_listener(DONE_CHANNEL, on_done)


def _waits_for_a_person(run: dict[str, Any]) -> bool:
    """Waiting for an approval or an answer (not for its own subagent runs)."""
    waiting = run.get("waiting_for")
    reason = waiting.get("reason") if isinstance(waiting, dict) else None
    return bool(run["status"] == RunStatus.WAITING and reason != "children")
