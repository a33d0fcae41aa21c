"""The middleware interfaces (docs/design.md §5.1).

A middleware is anything with a `name`. Capabilities are optional protocols,
discovered once when the chain is built (`isinstance`), never per call.

Each middleware module (agent/middlewares/) builds its middleware for one run
attempt with `build(ctx: StackContext) -> Middleware | None`: the agent's settings
(the module's own config section of `AgentConfig`) and the run's ports; None when
the middleware is idle for the agent (agent/stack.py:default_stack skips it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

from hango_worker.agent.ports import ChildRuns, DecisionRecord, FileStore, MemoryBinding, SkillStore
from hango_worker.agent.state import State
from hango_worker.provider.types import (
    Message,
    Request,
    Response,
    TextBlock,
    TextSink,
    ToolUseBlock,
    evolve,
)
from hango_worker.tool.types import Tool, ToolContext, ToolResult

ModelResponse = Response
SystemRewrite = Callable[[list[TextBlock]], list[TextBlock]]
# A model call a middleware makes on the run's behalf (e.g. a summary), set by the
# loop: retried like any model call, under its own `chat` span, cancelled with the
# run, its usage counted in the run's.
SideCall = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class SystemLayout:
    """Where the assembled system blocks came from, in order: `parts` holds
    `(chain position, block count)` per source, the agent's own blocks first
    (position -1), then each contributor's. Recorded by `Chain.assemble_system`."""

    parts: tuple[tuple[int, int], ...]
    positions: Mapping[str, int]  # chain position of every middleware, by name

    def blocks_before(self, name: str) -> int:
        """How many blocks come from the agent and the contributors placed before
        middleware `name` in the chain: the index where later contributors start."""
        pos = self.positions[name]
        return sum(n for p, n in self.parts if p < pos)


# Applied by the base handler to the exact request the provider receives: after the
# system is assembled and rewritten, after every inner middleware's changes.
RequestRewrite = Callable[[Request, SystemLayout], Request]


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One model call. `request.system` is assembled by the base handler on
    every call; a wrapper that wants to change the assembled blocks (e.g. set
    a cache breakpoint by index) adds a `system_rewrite`, applied in order
    right after assembly (setting `request.system` directly has no effect: the
    base handler always assembles it). Rewrite a copy (`with_request`), never the state."""

    request: Request
    state: State
    on_text: TextSink | None = None
    system_rewrites: tuple[SystemRewrite, ...] = ()
    call_model: SideCall | None = None
    final_rewrites: tuple[RequestRewrite, ...] = ()

    def with_request(self, **changes: Any) -> ModelRequest:
        return evolve(self, request=evolve(self.request, **changes))

    def rewrite_system(self, fn: SystemRewrite) -> ModelRequest:
        return evolve(self, system_rewrites=(*self.system_rewrites, fn))

    def rewrite_final(self, fn: RequestRewrite) -> ModelRequest:
        """Rewrite the request as the provider will receive it (e.g. cache breakpoints,
        which must sit on the final tools, system and messages), with the layout of
        its assembled system blocks. Applied in order, after the system rewrites."""
        return evolve(self, final_rewrites=(*self.final_rewrites, fn))


@dataclass(frozen=True, slots=True)
class ToolCallRequest:
    call: ToolUseBlock
    state: State
    context: ToolContext
    tool: Tool | None = None  # the tool the name resolves to this turn (None: unknown)

    def with_call(self, **changes: Any) -> ToolCallRequest:
        return evolve(self, call=evolve(self.call, **changes))


class SuspendRun(Exception):
    """Raised by a tool wrapper to suspend the run before this call executes: the run
    becomes `waiting` (docs/design.md §12, one way to wait) until a decision arrives.
    `reason` is what it waits for ("approval", "question"); `detail` is shown to the
    person who decides (JSON data). Wrappers outside it must not count the call."""

    def __init__(self, reason: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail or {}


class AwaitChild(SuspendRun):
    """Raised by the Subagent middleware for a `task` call whose child run is queued or
    running: unlike other suspensions the batch goes on (several children run at
    once), and the run waits for all of them at the end of the batch."""

    def __init__(self, child_run_id: str) -> None:
        super().__init__("children", {"child_run_id": child_run_id})
        self.child_run_id = child_run_id


ModelHandler = Callable[[ModelRequest], Awaitable[ModelResponse]]
ToolHandler = Callable[[ToolCallRequest], Awaitable[ToolResult]]


@runtime_checkable
class Middleware(Protocol):
    name: str


@runtime_checkable
class ModelWrapper(Protocol):
    name: str

    async def wrap_model_call(self, req: ModelRequest, next: ModelHandler) -> ModelResponse: ...


@runtime_checkable
class ToolWrapper(Protocol):
    name: str

    async def wrap_tool_call(self, req: ToolCallRequest, next: ToolHandler) -> ToolResult: ...


@runtime_checkable
class RunHook(Protocol):
    name: str

    async def before_run(self, state: State) -> None: ...


@runtime_checkable
class ToolProvider(Protocol):
    name: str

    def provide_tools(self, state: State) -> list[Tool]: ...


@runtime_checkable
class PromptContributor(Protocol):
    name: str

    def system_blocks(self, state: State) -> list[TextBlock]: ...


@runtime_checkable
class CallOrder(Protocol):
    """A middleware that needs some calls handled alone, in call order (e.g. a call
    that waits for a person's approval): the batch's calls before such a call finish
    first and the calls after it start after it (docs/design.md §5.5)."""

    name: str

    def runs_alone(self, call: ToolUseBlock) -> bool: ...


@dataclass(frozen=True, slots=True)
class Answer:
    """An AnswerCheck's verdict on a reply that gives the run's final answer: `reply`
    joins the history first (the final tool's result, or what is wrong with the answer);
    then the run ends `succeeded` with `output` (`accepted`), or `failed` with `error`,
    or (neither) goes on with another turn, counted like any turn."""

    reply: Message | None = None
    accepted: bool = False
    output: Any = None
    error: dict[str, Any] | None = None


@runtime_checkable
class AnswerCheck(Protocol):
    """A middleware that checks the final answer (agent/middlewares/output.py). Called by the loop
    after every model reply (`last`: the wind-up's reply, no turn may follow); None: not
    an answer it checks, the loop goes on as without it."""

    name: str

    def check_answer(self, state: State, resp: ModelResponse, last: bool) -> Answer | None: ...


DEFAULT_REPEAT_CALL_THRESHOLD = 3
Section = TypeVar("Section", bound=BaseModel)


class AgentView(Protocol):
    """What a middleware's `build` reads of the agent (agent/spec.py:AgentSpec)."""

    @property
    def model(self) -> str: ...

    @property
    def config(self) -> BaseModel: ...


@dataclass(frozen=True, slots=True)
class StackContext:
    """What every middleware module's `build` gets: the agent (its `config` is the
    `AgentConfig` that inherits each module's config section), the tools it may use,
    and the run's ports and values. Built once per run attempt (agent/stack.py)."""

    allowlist: tuple[str, ...]
    # the worker's default (HANGO_REPEAT_CALL_THRESHOLD); the agent's own one wins
    repeat_call_threshold: int = DEFAULT_REPEAT_CALL_THRESHOLD
    # the run's files (run_files); None: only writes still in the outbox can be read
    files: FileStore | None = None
    # the run's memory store and scope; required when the agent lists the memory tool
    memory: MemoryBinding | None = None
    # decisions for the pending turn of a run resumed after waiting (by tool_use id)
    decisions: Mapping[str, DecisionRecord] = field(default_factory=dict)
    # the run's child runs (subagents) and its depth (0: a top-level run)
    children: ChildRuns | None = None
    depth: int = 0
    # the tenant's skill store (read port); required when the agent enables skills
    skills: SkillStore | None = None
    # None: every section at its defaults (a stack built without an agent, in tests)
    agent: AgentView | None = None

    @property
    def model(self) -> str:
        return "" if self.agent is None else self.agent.model

    def settings(self, section: type[Section]) -> Section:
        """The agent's settings for one middleware: its config section, which the
        agent's config inherits (defaults when the stack has no agent)."""
        if self.agent is None:
            return section()
        config = self.agent.config
        if not isinstance(config, section):
            raise TypeError(f"the agent's config has no {section.__name__} section")
        return config


Build = Callable[[StackContext], Middleware | None]
