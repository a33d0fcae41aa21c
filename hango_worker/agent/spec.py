"""What the loop needs to know about an agent (the `agents` row, typed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

from hango_worker.agent.limits import Budget
from hango_worker.agent.middlewares.filesystem import FilesystemConfig
from hango_worker.agent.middlewares.hitl import HitlConfig
from hango_worker.agent.middlewares.memory import MemoryConfig
from hango_worker.agent.middlewares.output import OutputConfig
from hango_worker.agent.middlewares.prompt_cache import PromptCacheConfig
from hango_worker.agent.middlewares.repeat import RepeatConfig
from hango_worker.agent.middlewares.skills import TOOL_NAME as LOAD_SKILL
from hango_worker.agent.middlewares.skills import SkillsConfig
from hango_worker.agent.middlewares.subagent import SubagentConfig
from hango_worker.agent.middlewares.summarize import SummarizeConfig
from hango_worker.provider import params as api
from hango_worker.provider.platforms import PlatformConfig, platform_problem
from hango_worker.provider.types import TextBlock
from hango_worker.tool.mcp_config import McpConfig, mcp_problem


def skills_problem(tools: list[str], config: AgentConfig) -> str | None:
    """Why the agent's skills cannot work, if they cannot: they need its load_skill tool."""
    if config.skills and LOAD_SKILL not in tools:
        return f"config.skills is set but the agent's tools do not include {LOAD_SKILL!r}"
    return None


class LoopConfig(BaseModel):
    """The loop's own keys of `agents.config`: its turns, its requests' size and
    sampling, its parallel tool calls, what a limit does (agent/loop.py, agent/limits.py;
    run/execute.py builds the loop from them)."""

    max_turns: int | None = Field(default=None, ge=1, le=10_000)
    max_tokens: int = Field(default=4096, ge=1, le=128_000)
    # a response's tool calls run side by side, at most this many at once (1: one after
    # another; None: agent/loop.py DEFAULT_MAX_PARALLEL_TOOLS)
    max_parallel_tools: int | None = Field(default=None, ge=1, le=64)
    temperature: float | None = Field(default=None, ge=0, le=1)
    # at a limit (max_turns): one last tool-free call for the answer, or fail (agent/limits.py)
    on_limit: Literal["answer", "fail"] = "answer"
    server_tools: list[dict[str, Any]] | None = Field(default=None, max_length=64)
    # stored images and documents sent as Files API files, uploaded once, instead of
    # their base64 in every request (provider/files.py, docs/inputs-and-outputs.md)
    files_api: bool = False


# pydantic orders the fields, and runs the sections' validators, from the LAST base to
# the first: the stored keys read Budget's, the loop's, then each middleware's.
class AgentConfig(
    PlatformConfig,  # provider/platforms.py: platform, region, project_id, models
    McpConfig,  # tool/mcp_config.py: mcp_servers (tool/mcp_client.py opens them)
    SkillsConfig,  # agent/middlewares/skills.py: skills
    PromptCacheConfig,  # agent/middlewares/prompt_cache.py: cache_ttl
    OutputConfig,  # agent/middlewares/output.py: output_schema, output_mode
    SummarizeConfig,  # agent/middlewares/summarize.py: the compaction keys
    MemoryConfig,  # agent/middlewares/memory.py: memory_scope
    FilesystemConfig,  # agent/middlewares/filesystem.py: offload_threshold_bytes
    SubagentConfig,  # agent/middlewares/subagent.py: subagents, max_depth
    HitlConfig,  # agent/middlewares/hitl.py: approvals and their timeout
    RepeatConfig,  # agent/middlewares/repeat.py: repeat_call_threshold
    LoopConfig,  # the loop's own keys (above)
    Budget,  # agent/limits.py: the run budget (tokens, tool calls, duration)
):
    """`agents.config`: one flat JSON object, composed of config sections. Each
    middleware module that has settings holds its section (exactly the keys it reads),
    so a new setting is added in its middleware's module only; the loop's own keys are
    `LoopConfig`'s, the run budget's `Budget`'s. Unknown keys are rejected so a typo is
    not silently ignored; beside hango's keys, every Messages API request parameter the
    installed SDK knows (provider/params.py: thinking, output_config, stop_sequences,
    metadata, service_tier, betas, context_management, …), validated by the SDK's own
    types, and `server_tools` (Anthropic's web search, web fetch, code execution, …)."""

    model_config = ConfigDict(extra="allow")  # the API's parameters only (_api_params)

    # the API's parameters are this object's extra keys: checked after every section
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
        lacking = platform_problem(
            self.platform, files_api=self.files_api, server_tools=self.server_tools, params=given
        )
        if lacking:
            raise PydanticCustomError("platform", "{why}", {"why": lacking})
        return self

    def api_params(self) -> dict[str, Any]:
        """The Messages API parameters set for this agent (sent with every model call)."""
        return {k: v for k, v in (self.model_extra or {}).items() if v is not None}


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
        problem = skills_problem(self.tools, self.config) or mcp_problem(
            self.tools, self.config.mcp_servers
        )
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
