"""Choosing the model provider from the configuration."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from hango_worker.agent.control import RunControl
from hango_worker.agent.spec import AgentSpec
from hango_worker.config import ConfigError, Settings
from hango_worker.provider.anthropic import AnthropicProvider, MissingCredentialsError
from hango_worker.provider.platforms import model_on, target_of
from hango_worker.provider.scripted import ScriptedProvider, ScriptError, load_script
from hango_worker.provider.types import Provider, Request, Response, TextSink
from hango_worker.run.budget import RunBudgetGate
from hango_worker.run.ratelimit import RunRateGate

DEMO_SCRIPT = Path(__file__).resolve().parent.parent / "demo" / "script.json"


def make_provider(
    settings: Settings, *, demo: bool = False, chunk_delay_s: float = 0.0
) -> Provider:
    """scripted | anthropic | auto (anthropic when ANTHROPIC_API_KEY is set or the fleet's
    platform is Bedrock or Vertex, else the scripted model — for the demo only; `run`
    refuses to guess)."""
    choice = settings.model_provider
    has_key = bool(os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN"))
    if choice == "auto":
        if has_key or settings.platform != "anthropic":  # Bedrock, Vertex: their own chains
            choice = "anthropic"
        elif demo:
            choice = "scripted"
        else:
            raise ConfigError(
                "configuration error: HANGO_MODEL_PROVIDER=auto needs ANTHROPIC_API_KEY for "
                "`run`; set the key, or HANGO_MODEL_PROVIDER=scripted with HANGO_SCRIPT for tests"
            )
    on_api = settings.platform == "anthropic"
    if choice == "anthropic":
        if not has_key and on_api:
            raise ConfigError(
                "configuration error: HANGO_MODEL_PROVIDER=anthropic but ANTHROPIC_API_KEY is "
                "not set"
            )
        try:
            # with a fleet-wide rate limit every request must pass the gate (run/
            # ratelimit.py): the SDK's own retries would not, so the loop retries instead
            retries = 0 if settings.rate_limit_key else settings.anthropic_max_retries
            return AnthropicProvider(max_retries=retries, require_key=on_api)
        except MissingCredentialsError as e:
            raise ConfigError(f"configuration error: the Anthropic client: {e}") from None
    path = settings.script or (DEMO_SCRIPT if demo else None)
    if path is None:
        raise ConfigError(
            "configuration error: HANGO_MODEL_PROVIDER=scripted needs HANGO_SCRIPT "
            "(a JSON list of turns)"
        )
    try:
        return ScriptedProvider(load_script(path), chunk_delay_s=chunk_delay_s)
    except ScriptError as e:
        raise ConfigError(f"configuration error: HANGO_SCRIPT={str(path)!r}: {e}") from None


class OnPlatform:
    """A provider sending the agent's model as its id on the platform (`models`)."""

    def __init__(self, inner: Provider, model: str, platform_model: str) -> None:
        self.inner, self.name = inner, inner.name
        self.model = model  # the agent's model
        self.platform_model = platform_model  # what is sent instead

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        if request.model == self.model:
            request = replace(request, model=self.platform_model)
        return await self.inner.complete(request, on_text)


def provider_for(
    base: Provider, agent: AgentSpec, settings: Settings, control: RunControl
) -> Provider:
    """The worker's provider on the agent's platform (provider/platforms.py), sending the
    agent's model id there; a fleet-wide rate limit then takes from a bucket per platform
    and region. Any other provider (the scripted model) is used as it is."""
    if not isinstance(base, AnthropicProvider):
        return base
    target = target_of(
        agent.config, settings.platform, settings.platform_region, settings.vertex_project
    )
    try:
        provider = base.on_platform(target)
    except (ValueError, MissingCredentialsError) as e:  # no region, no project, …
        raise ConfigError(f"configuration error: the {target.platform} client: {e}") from None
    gate, budget = control.rate_gate, control.budget_gate
    if isinstance(gate, RunRateGate) and target.platform != "anthropic":
        gate.place = f"@{target.platform}:{target.region or ''}"
    if isinstance(budget, RunBudgetGate):  # the platform's prices (provider/prices.py)
        budget.prices = budget.prices.on_platform(target.platform)
    mapped = model_on(agent.config, target.platform, agent.model)
    return provider if mapped == agent.model else OnPlatform(provider, agent.model, mapped)


def platform_of(base: Provider, agent: AgentSpec, settings: Settings) -> str:
    """The platform the agent's calls go to ("anthropic" for the scripted model)."""
    if not isinstance(base, AnthropicProvider):
        return "anthropic"
    return agent.config.platform or settings.platform
