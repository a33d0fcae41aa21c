"""Choosing the model provider from the configuration."""

from __future__ import annotations

import os
from pathlib import Path

from hango_worker.config import ConfigError, Settings
from hango_worker.provider.scripted import ScriptedProvider, ScriptError, load_script
from hango_worker.provider.types import Provider

DEMO_SCRIPT = Path(__file__).resolve().parent.parent / "demo" / "script.json"


def make_provider(
    settings: Settings, *, demo: bool = False, chunk_delay_s: float = 0.0
) -> Provider:
    """scripted | anthropic | auto (anthropic when ANTHROPIC_API_KEY is set, else the
    scripted model — for the demo only; `run` refuses to guess)."""
    choice = settings.model_provider
    has_key = bool(os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN"))
    if choice == "auto":
        if has_key:
            choice = "anthropic"
        elif demo:
            choice = "scripted"
        else:
            raise ConfigError(
                "configuration error: HANGO_MODEL_PROVIDER=auto needs ANTHROPIC_API_KEY for "
                "`run`; set the key, or HANGO_MODEL_PROVIDER=scripted with HANGO_SCRIPT for tests"
            )
    if choice == "anthropic":
        if not has_key:
            raise ConfigError(
                "configuration error: HANGO_MODEL_PROVIDER=anthropic but ANTHROPIC_API_KEY is "
                "not set"
            )
        from hango_worker.provider.anthropic import AnthropicProvider, MissingCredentialsError

        try:
            # with a fleet-wide rate limit every request must pass the gate (run/
            # ratelimit.py): the SDK's own retries would not, so the loop retries instead
            retries = 0 if settings.rate_limit_key else settings.anthropic_max_retries
            return AnthropicProvider(max_retries=retries)
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
