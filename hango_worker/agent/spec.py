"""What the loop needs to know about an agent (the `agents` row, typed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from hango_worker.agent.limits import Budget
from hango_worker.agent.middlewares.hitl import ApprovalRule
from hango_worker.provider import params as api
from hango_worker.provider import structured
from hango_worker.provider.types import TextBlock

# a skill's name, as Anthropic's Agent Skills format allows it (store/skills.py checks it too)
SKILL_NAME = r"^[a-z0-9]+(-[a-z0-9]+)*$"
LOAD_SKILL = "load_skill"


def skills_problem(tools: list[str], config: AgentConfig) -> str | None:
    """Why the agent's skills cannot work, if they cannot: they need its load_skill tool."""
    if config.skills and LOAD_SKILL not in tools:
        return f"config.skills is set but the agent's tools do not include {LOAD_SKILL!r}"
    return None


class AgentConfig(Budget):
    """`agents.config`. Unknown keys are rejected so a typo is not silently ignored.
    The run budget's keys (tokens, tool calls, duration) come from `Budget`; beside
    hango's keys, every Messages API request parameter the installed SDK knows
    (provider/params.py: thinking, output_config, stop_sequences, metadata,
    service_tier, betas, context_management, …), validated by the SDK's own types,
    and `server_tools` (Anthropic's web search, web fetch, code execution, …)."""

    model_config = ConfigDict(extra="allow")  # the API's parameters only (_api_params)
    max_turns: int | None = Field(default=None, ge=1, le=10_000)
    max_tokens: int = Field(default=4096, ge=1, le=128_000)
    repeat_call_threshold: int | None = Field(default=None, ge=2, le=1000)
    # a response's tool calls run side by side, at most this many at once (1: one after
    # another; None: agent/loop.py DEFAULT_MAX_PARALLEL_TOOLS)
    max_parallel_tools: int | None = Field(default=None, ge=1, le=64)
    temperature: float | None = Field(default=None, ge=0, le=1)
    # at a limit (max_turns): one last tool-free call for the answer, or fail (agent/limits.py)
    on_limit: Literal["answer", "fail"] = "answer"
    # calls that wait for a person's approval (agent/middlewares/hitl.py), and for how long
    approvals: list[ApprovalRule] = Field(default_factory=list)
    approval_timeout_s: float | None = Field(default=None, gt=0, le=90 * 86400)
    on_approval_timeout: Literal["reject", "fail"] = "reject"
    # agents this one may delegate to with `task` (besides "general": itself), and how
    # deep subagents may nest (agent/middlewares/subagent.py)
    subagents: list[str] = Field(default_factory=list)
    max_depth: int | None = Field(default=None, ge=1, le=10)
    # tool results larger than this (UTF-8 bytes) go to a run file (None: 20_000)
    offload_threshold_bytes: int | None = Field(default=None, ge=1_000, le=100_000_000)
    # whose long-term memory the `memory` tool edits: the agent's (shared by all its
    # runs; None = "agent"), the session's, or the caller's (the run's `memory_key`)
    memory_scope: Literal["agent", "session", "key"] | None = None
    # compaction (middlewares/summarize.py); unset: the window, 0.8, 0.5, 5, the agent's model
    context_window: int | None = Field(default=None, ge=1024, le=10_000_000)
    compact_trigger: float | None = Field(default=None, gt=0, le=1)
    compact_target: float | None = Field(default=None, gt=0, lt=1)
    keep_tool_results: int | None = Field(default=None, ge=1, le=10_000)
    summary_model: str | None = Field(default=None, min_length=1, max_length=200)

    server_tools: list[dict[str, Any]] | None = Field(default=None, max_length=64)
    # a structured final answer (agent/middlewares/output.py, docs/structured-output.md): the JSON
    # Schema it must match, and how it is asked for (auto: the API's structured outputs
    # where the model has them, else the forced final tool)
    output_schema: dict[str, Any] | None = None
    output_mode: Literal["auto", "native", "tool"] = "auto"

    @field_validator("output_schema")
    @classmethod
    def _valid_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            try:
                structured.check_schema(v)
            except ValueError as e:
                raise PydanticCustomError("output_schema", "{why}", {"why": str(e)}) from None
        return v

    @model_validator(mode="after")
    def _output_schema(self) -> AgentConfig:
        if self.output_schema is None:
            return self
        fmt = (self.model_extra or {}).get("output_config") or {}
        if isinstance(fmt, dict) and fmt.get("format") is not None:
            raise PydanticCustomError(
                "output_schema",
                "output_schema and output_config.format cannot both be set: "
                "output_schema sends output_config.format itself",
            )
        if self.output_mode == "native":
            try:
                structured.output_format(self.output_schema)
            except (ValueError, TypeError) as e:
                raise PydanticCustomError(
                    "output_schema",
                    "output_schema: the API's structured outputs cannot express it ({why}); "
                    "use output_mode auto or tool",
                    {"why": str(e)},
                ) from None
        return self

    @model_validator(mode="after")
    def _api_params(self) -> AgentConfig:
        extra = self.model_extra or {}
        for key in extra:
            if key not in api.ALL_PARAMS:
                raise PydanticCustomError(
                    "extra_forbidden",
                    "{key}: Extra inputs are not permitted (neither a hango agent setting nor "
                    "a Messages API parameter this SDK knows)",
                    {"key": key},
                )
        try:
            given = {k: v for k, v in extra.items() if v is not None}
            api.check_params(given)
            api.check_server_tools(self.server_tools or [], api.uses_beta(given))
            api.check_combinations(given, max_tokens=self.max_tokens, temperature=self.temperature)
        except ValueError as e:
            raise PydanticCustomError("api_param", "{why}", {"why": str(e)}) from None
        return self

    def api_params(self) -> dict[str, Any]:
        """The Messages API parameters set for this agent (sent with every model call)."""
        return {k: v for k, v in (self.model_extra or {}).items() if v is not None}

    @model_validator(mode="after")
    def _target_below_trigger(self) -> AgentConfig:
        trigger = 0.8 if self.compact_trigger is None else self.compact_trigger
        target = 0.5 if self.compact_target is None else self.compact_target
        if target >= trigger:
            raise ValueError(f"compact_target ({target}) must be below compact_trigger ({trigger})")
        return self

    # prompt-cache TTL of the stable prefix (tools + system); see agent/middlewares/prompt_cache.py
    cache_ttl: Literal["5m", "1h"] = "5m"
    # Agent Skills enabled for the agent, by name (agent/middlewares/skills.py); needs the
    # `load_skill` tool in the agent's tools
    skills: list[Annotated[str, StringConstraints(pattern=SKILL_NAME, max_length=64)]] = Field(
        default_factory=list, max_length=100
    )

    @model_validator(mode="after")
    def _skills_unique(self) -> AgentConfig:
        if len(set(self.skills)) != len(self.skills):
            raise ValueError("skills lists a skill twice")
        return self


def with_params(config: AgentConfig, params: Mapping[str, Any]) -> AgentConfig:
    """`config` with a run's Messages API parameter overrides laid over it: each key
    replaces the agent's value (null unsets it), and the merged config is validated by
    the same rules as `agents.config` (provider/params.py), so a combination of the
    agent's settings and the run's (thinking with the agent's temperature, a budget
    not below the agent's max_tokens) is refused naming both keys. ValueError: one line.
    Only the API's parameters may be overridden (`api.ALL_PARAMS`)."""
    if not isinstance(params, Mapping):
        raise ValueError(f"params must be a JSON object, got {type(params).__name__}")
    for key in params:
        if key not in api.ALL_PARAMS:
            raise ValueError(
                f"params.{key}: not a Messages API parameter this SDK knows (a run "
                "overrides only those; limits go in the run's limits, hango's own "
                "settings in the agent's config)"
            )
    merged = {**config.model_dump(exclude_none=True), **params}
    try:
        return AgentConfig.model_validate(merged)
    except ValidationError as e:
        raise ValueError(str(e.errors()[0]["msg"])) from None


def check_run_params(agent_config: Mapping[str, Any], params: Any) -> dict[str, Any]:
    """A producer's per-run parameters checked against its agent's config (as stored in
    `agents.config`); what to store as `runs.input.params`. ValueError: one line."""
    if not isinstance(params, Mapping):
        raise ValueError(f"params must be a JSON object, got {type(params).__name__}")
    try:
        config = AgentConfig.model_validate(dict(agent_config))
    except ValidationError as e:  # the agent itself: its row was edited by hand
        raise ValueError(f"the agent's config is invalid: {e.errors()[0]['msg']}") from None
    with_params(config, params)
    return dict(params)


def with_user_id(config: AgentConfig, user_id: str) -> AgentConfig:
    """`config` with `metadata.user_id` set to `user_id` unless the config sets one (the
    agent's or the run's metadata wins). The worker passes the run's tenant id: an
    opaque, stable id per tenant, so Anthropic's abuse signals are per tenant and no
    name (which may be personal data) leaves hango."""
    metadata = (config.model_extra or {}).get("metadata")
    if isinstance(metadata, dict) and metadata.get("user_id") is not None:
        return config
    base = metadata if isinstance(metadata, dict) else {}
    return config.model_copy(update={"metadata": {**base, "user_id": user_id}})


class AgentSpecError(ValueError):
    pass


class AgentSpec(BaseModel):
    model_config = ConfigDict(frozen=True)
    id: str
    name: str
    model: str
    system: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    config: AgentConfig = Field(default_factory=AgentConfig)

    @model_validator(mode="after")
    def _skills_tool(self) -> AgentSpec:
        problem = skills_problem(self.tools, self.config)
        if problem:
            raise ValueError(problem)
        return self

    def system_blocks(self) -> list[TextBlock]:
        return [TextBlock(text=s) for s in self.system]

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> AgentSpec:
        try:
            system = row.get("system") or []
            if isinstance(system, list):
                system = [b["text"] if isinstance(b, dict) else str(b) for b in system]
            return cls(
                id=str(row["id"]),
                name=row["name"],
                model=row["model"],
                system=system,
                tools=list(row.get("tools") or []),
                config=AgentConfig.model_validate(row.get("config") or {}),
            )
        except (ValidationError, KeyError, TypeError) as e:
            raise AgentSpecError(
                f"agent {row.get('name')!r} has an invalid definition: {e}"
            ) from None
