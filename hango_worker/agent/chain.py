"""The chain: middlewares partitioned once by capability, composed as onions.

Index 0 is outermost for both model and tool calls (pinned by tests/test_chain.py).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

from hango_worker.agent.middleware import (
    Answer,
    AnswerCheck,
    CallOrder,
    Middleware,
    ModelHandler,
    ModelRequest,
    ModelResponse,
    ModelWrapper,
    PromptContributor,
    RunHook,
    SystemLayout,
    ToolCallRequest,
    ToolHandler,
    ToolProvider,
    ToolWrapper,
)
from hango_worker.agent.state import State
from hango_worker.provider.types import TextBlock, ToolUseBlock
from hango_worker.telemetry import metrics
from hango_worker.telemetry.tracing import MW_NAME, tracer
from hango_worker.tool.types import Tool, ToolResult


def _compose_model(wrappers: Sequence[ModelWrapper], base: ModelHandler) -> ModelHandler:
    handler = base
    for w in reversed(wrappers):
        handler = functools.partial(w.wrap_model_call, next=handler)
    return handler


def _compose_tool(wrappers: Sequence[ToolWrapper], base: ToolHandler) -> ToolHandler:
    handler = base
    for w in reversed(wrappers):
        handler = functools.partial(w.wrap_tool_call, next=handler)
    return handler


_CAPABILITIES = (
    ModelWrapper,
    ToolWrapper,
    RunHook,
    ToolProvider,
    PromptContributor,
    CallOrder,
    AnswerCheck,
)
# isinstance against runtime_checkable protocols is slow (it inspects the class every
# time); a middleware class's capabilities never change, so they are looked up once.
_capability_cache: dict[type, tuple[bool, ...]] = {}
# A stack's partition by capability (indexes into it, per capability), by its classes:
# built once per stack shape, not per run.
_partition_cache: dict[tuple[type, ...], tuple[tuple[int, ...], ...]] = {}


def capabilities(m: Middleware) -> tuple[bool, ...]:
    """(model wrapper, tool wrapper, run hook, tool provider, prompt contributor,
    call order, answer check)."""
    cls = type(m)
    found = _capability_cache.get(cls)
    if found is None:
        found = tuple(isinstance(m, p) for p in _CAPABILITIES)
        _capability_cache[cls] = found
    return found


class Chain:
    """Built once per run attempt from an ordered list (None entries = unbuilt slots)."""

    def __init__(self, middlewares: Sequence[Middleware | None]) -> None:
        mws = [m for m in middlewares if m is not None]
        seen: set[str] = set()
        for m in mws:
            if m.name in seen:
                raise ValueError(f"middleware {m.name!r} appears twice in the stack")
            seen.add(m.name)
        self.middlewares = mws
        self.names = [m.name for m in mws]
        shape = tuple(type(m) for m in mws)
        parts = _partition_cache.get(shape)
        if parts is None:
            caps = [capabilities(m) for m in mws]
            parts = tuple(
                tuple(j for j, c in enumerate(caps) if c[i]) for i in range(len(_CAPABILITIES))
            )
            _partition_cache[shape] = parts

        def having(i: int) -> list[Any]:
            return [mws[j] for j in parts[i]]

        self.model_wrappers: list[ModelWrapper] = having(0)
        self.tool_wrappers: list[ToolWrapper] = having(1)
        self.run_hooks: list[RunHook] = having(2)
        self.tool_providers: list[ToolProvider] = having(3)
        self.contributors: list[PromptContributor] = having(4)
        self.positions = {m.name: i for i, m in enumerate(mws)}
        self._contributor_positions = [self.positions[c.name] for c in self.contributors]
        self._model: tuple[ModelHandler, ModelHandler] | None = None
        self._tool: tuple[ToolHandler, ToolHandler] | None = None
        self._ordering: list[CallOrder] = having(5)
        self.answer_checks: list[AnswerCheck] = having(6)

    async def model_call(self, req: ModelRequest, base: ModelHandler) -> ModelResponse:
        if self._model is None or self._model[0] is not base:
            self._model = (base, _compose_model(self.model_wrappers, base))
        return await self._model[1](req)

    async def tool_call(self, req: ToolCallRequest, base: ToolHandler) -> ToolResult:
        if self._tool is None or self._tool[0] is not base:
            self._tool = (base, _compose_tool(self.tool_wrappers, base))
        return await self._tool[1](req)

    def runs_alone(self, call: ToolUseBlock) -> bool:
        """Whether a middleware needs this call handled alone, in call order."""
        return any(m.runs_alone(call) for m in self._ordering)

    def check_answer(self, state: State, resp: ModelResponse, last: bool) -> Answer | None:
        """The first answer check's verdict on a model reply (None: no check has one)."""
        for c in self.answer_checks:
            verdict = c.check_answer(state, resp, last)
            if verdict is not None:
                return verdict
        return None

    async def before_run(self, state: State) -> None:
        """Each hook once per run attempt, under one `agent.before_run` span."""
        if not self.run_hooks:
            return
        t = tracer()
        with t.start_as_current_span("agent.before_run"):
            for hook in self.run_hooks:
                started = time.perf_counter()
                with t.start_as_current_span(
                    f"agent.before_run {hook.name}", attributes={MW_NAME: hook.name}
                ):
                    await hook.before_run(state)
                metrics.child(metrics.MW_BEFORE_RUN, hook.name).observe(
                    time.perf_counter() - started
                )

    def tools(self, state: State) -> list[Tool]:
        out: list[Tool] = []
        for p in self.tool_providers:
            out.extend(p.provide_tools(state))
        return out

    def system_blocks(self, agent_blocks: Sequence[TextBlock], state: State) -> list[TextBlock]:
        """The agent's own blocks, then each contributor's, in chain order."""
        return self.assemble_system(agent_blocks, state)[0]

    def assemble_system(
        self, agent_blocks: Sequence[TextBlock], state: State
    ) -> tuple[list[TextBlock], SystemLayout]:
        """`system_blocks`, and how many blocks each source gave (for breakpoints by index)."""
        blocks = list(agent_blocks)
        parts = [(-1, len(blocks))]
        for c, pos in zip(self.contributors, self._contributor_positions, strict=True):
            mine = c.system_blocks(state)
            blocks.extend(mine)
            parts.append((pos, len(mine)))
        return blocks, SystemLayout(tuple(parts), self.positions)
