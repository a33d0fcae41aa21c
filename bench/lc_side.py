"""Benchmark 1, LangChain side: `create_agent` + `AsyncPostgresSaver`.

Imported only when LangChain is installed (`make bench` installs the `bench`
extra into .venv-bench); the product's own environment never needs it.

The fake chat model plays the same script as hango's scripted model (turn N
chosen from the number of AI messages in the request, one tool call per
turn, zero latency) and reads the same recorder clock at every call.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg
from langchain.agents import create_agent
from langchain.agents.middleware import TodoListMiddleware
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from pydantic import ConfigDict

from bench.common import live_bytes, relation_bytes
from bench.per_turn import TurnRecorder, run_result, sample_points, turn_call

LC_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


@tool
async def step(n: int) -> str:
    """Does step n."""
    return f"step {n} done"


class FakeToolModel(BaseChatModel):
    """Zero-latency chat model: one tool call per turn for `turns` turns, then an answer."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    turns: int
    todo: bool = False
    recorder: Any = None

    @property
    def _llm_type(self) -> str:
        return "bench-fake"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> FakeToolModel:
        return self

    def _answer(self, messages: list[BaseMessage]) -> AIMessage:
        i = sum(1 for m in messages if isinstance(m, AIMessage))
        if i >= self.turns:
            return AIMessage(content="All steps done.")
        name, args = turn_call(i, self.todo)
        call = {"name": name, "args": args, "id": f"call_{i:04d}_0", "type": "tool_call"}
        return AIMessage(content=f"Turn {i}.", tool_calls=[call])

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._answer(messages))])

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        if self.recorder is not None:
            await self.recorder.on_call()
        return ChatResult(generations=[ChatGeneration(message=self._answer(messages))])


async def setup(dsn: str) -> None:
    async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
        await saver.setup()


async def langchain_run(
    dsn: str, turns: int, *, todo: bool = False, durability: str | None = "sync"
) -> dict[str, Any]:
    """One run; durability "sync" (durable before the next step) or None (the default)."""
    conn = await asyncpg.connect(dsn)
    try:
        rec = TurnRecorder(conn, LC_TABLES, frozenset(sample_points(turns)))
        model = FakeToolModel(turns=turns, todo=todo, recorder=rec)
        middleware = [TodoListMiddleware()] if todo else []
        async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
            agent = create_agent(
                model,
                tools=[step],
                system_prompt="You are a benchmark agent.",
                middleware=middleware,
                checkpointer=saver,
            )
            config = {
                "configurable": {"thread_id": str(uuid.uuid4())},
                "recursion_limit": 10 * turns + 50,
            }
            kwargs = {"durability": durability} if durability else {}
            before = await relation_bytes(conn, LC_TABLES)
            live_before = await live_bytes(conn, LC_TABLES)
            started = time.perf_counter()
            result = await agent.ainvoke(
                {"messages": [HumanMessage("go")]},
                config,  # type: ignore[arg-type]
                **kwargs,  # type: ignore[arg-type]
            )
            returned = time.perf_counter()
        after = await relation_bytes(conn, LC_TABLES)
        live = await live_bytes(conn, LC_TABLES) - live_before
    finally:
        await conn.close()
    n_ai = sum(1 for m in result["messages"] if isinstance(m, AIMessage))
    if n_ai != turns + 1:
        raise RuntimeError(f"LangChain run made {n_ai} model calls, expected {turns + 1}")
    out = run_result(rec, turns, returned - started, after - before, live)
    # how long after the last model call ainvoke returned (the async mode's backlog)
    out["lag_s"] = returned - rec.last_raw
    return out
