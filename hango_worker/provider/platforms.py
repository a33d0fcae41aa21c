"""Where Claude runs: the Anthropic API, Amazon Bedrock or Google Vertex AI.

An agent's `platform` (else the fleet's, HANGO_PLATFORM), with its `region` (else
HANGO_PLATFORM_REGION, else the SDK's own: AWS_REGION / CLOUD_ML_REGION), `project_id`
(Vertex only; else HANGO_VERTEX_PROJECT, else ANTHROPIC_VERTEX_PROJECT_ID or the
project of Google's application default credentials) and `models`, the model id per
platform (`{"bedrock": "anthropic.claude-sonnet-4-5-20250929-v1:0", "vertex":
"claude-sonnet-4-5@20250929"}`; a platform not in it gets the agent's `model` as is),
so one agent config runs on any of them.

The clients are the SDK's own (`anthropic[bedrock,vertex]`): `AsyncAnthropicBedrock`
and `AsyncAnthropicVertex`, built once per worker for each platform, region and
project (`AnthropicProvider.on_platform`). Credentials come from each platform's
standard chain and never from the agent's config: AWS's (environment, profile, web
identity; or AWS_BEARER_TOKEN_BEDROCK), Google's application default credentials
(workload identity included). `PlatformClients(options=...)` hands extra arguments to
a platform's SDK client (a `base_url`, an `access_token` in tests).

What a platform lacks is refused when the agent is created (`platform_problem`, one
line naming the feature and the platform): the Files API (`files_api: true`), a beta
not in `PLATFORM_BETAS`, a server tool not in `PLATFORM_SERVER_TOOLS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import anthropic
from pydantic import BaseModel, Field

from hango_worker.provider import sdk_retries

Platform = Literal["anthropic", "bedrock", "vertex"]
PLATFORMS: tuple[Platform, ...] = ("anthropic", "bedrock", "vertex")
# gen_ai.provider.name on the spans and metrics (the OpenTelemetry GenAI conventions)
PROVIDER_NAMES: Mapping[str, str] = {
    "anthropic": "anthropic",
    "bedrock": "aws.bedrock",
    "vertex": "gcp.vertex_ai",
}
# The betas each platform serves (every one on the Anthropic API); any other is refused.
PLATFORM_BETAS: Mapping[str, frozenset[str]] = {
    "bedrock": frozenset({"interleaved-thinking-2025-05-14", "context-1m-2025-08-07"}),
    "vertex": frozenset({"interleaved-thinking-2025-05-14", "context-1m-2025-08-07"}),
}
# The server tools (their `type` without the date) each platform serves.
PLATFORM_SERVER_TOOLS: Mapping[str, frozenset[str]] = {
    "bedrock": frozenset(),
    "vertex": frozenset({"web_search"}),
}
AnyClient = (
    anthropic.AsyncAnthropic | anthropic.AsyncAnthropicBedrock | anthropic.AsyncAnthropicVertex
)


class PlatformConfig(BaseModel):
    """The agent's platform keys of `agents.config` (None: the fleet's default)."""

    platform: Platform | None = None
    region: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[a-z0-9-]+$")
    project_id: str | None = Field(default=None, min_length=1, max_length=128)
    models: dict[Platform, str] | None = None


@dataclass(frozen=True, slots=True)
class Target:
    """One platform client's identity: the platform, its region and (Vertex) project."""

    platform: Platform
    region: str | None = None
    project_id: str | None = None


def target_of(config: PlatformConfig, platform: str, region: str, project: str) -> Target:
    """The agent's target, its own keys over the fleet's defaults ('' = unset)."""
    chosen = config.platform or platform
    if chosen not in PLATFORMS:
        raise ValueError(f"unknown platform {chosen!r} (one of {', '.join(PLATFORMS)})")
    if chosen == "anthropic":
        return Target("anthropic")
    project_id = (config.project_id or project or None) if chosen == "vertex" else None
    return Target(chosen, config.region or region or None, project_id)


def model_on(config: PlatformConfig, platform: str, model: str) -> str:
    """The model id to send on `platform`: the agent's map, else its `model` as is."""
    return (config.models or {}).get(platform, model)  # type: ignore[call-overload, no-any-return]


def platform_problem(
    platform: str | None,
    *,
    files_api: bool,
    server_tools: list[dict[str, Any]] | None,
    params: Mapping[str, Any],
) -> str | None:
    """Why an agent cannot run on `platform`, one line; None: it can."""
    if platform is None or platform == "anthropic":
        return None
    if files_api:
        return f"files_api: the Files API is not available on {platform}"
    for beta in params.get("betas") or []:
        if beta not in PLATFORM_BETAS[platform]:
            return f"betas: the beta {beta!r} is not available on {platform}"
    for tool in server_tools or []:
        kind = str(tool.get("type", ""))
        base = kind.rsplit("_", 1)[0] if kind[-8:].isdigit() else kind
        if base not in PLATFORM_SERVER_TOOLS[platform]:
            return f"server_tools: the server tool {kind!r} is not available on {platform}"
    return None


def build_client(
    target: Target, *, max_retries: int, open_telemetry: bool, options: Mapping[str, Any]
) -> AnyClient:
    """The SDK's client for a Bedrock or Vertex target, with the hooks that count the
    SDK's own retries; credentials from the platform's standard chain (or `options`)."""
    http = anthropic.DefaultAsyncHttpxClient(event_hooks=sdk_retries.event_hooks())
    common: dict[str, Any] = {"max_retries": max_retries, "http_client": http}
    if not open_telemetry:
        common["open_telemetry"] = False
    if target.platform == "bedrock":
        if target.region:
            common["aws_region"] = target.region
        return anthropic.AsyncAnthropicBedrock(**common, **options)
    if target.platform == "vertex":
        if target.region:
            common["region"] = target.region
        if target.project_id:
            common["project_id"] = target.project_id
        return anthropic.AsyncAnthropicVertex(**common, **options)
    raise ValueError(f"no platform client for {target.platform!r}")
