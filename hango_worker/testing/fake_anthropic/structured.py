"""Structured outputs as the API takes them (docs/structured-output.md): the fake's
checks of `output_config.format` and of a forced tool choice, with the API's wording
where it is known; a scripted turn's `output` (testing/fake_anthropic/script.py) is the
reply's text as compact JSON."""

from __future__ import annotations

from typing import Any

import jsonschema

from hango_worker.provider.structured import native_support
from hango_worker.testing.fake_anthropic.validate import ApiError


def _bad(message: str) -> ApiError:
    return ApiError(400, "invalid_request_error", message)


def check_output_format(body: Any) -> None:
    """`output_config.format`: `{"type": "json_schema", "schema": {...}}`, a valid JSON
    Schema, for a model that has structured outputs (Claude 4.5 and later; a model this
    code does not know is let through)."""
    config = body.get("output_config") if isinstance(body, dict) else None
    if config is None:
        return
    if not isinstance(config, dict):
        raise _bad("output_config: Input should be a valid dictionary")
    fmt = config.get("format")
    if fmt is None:
        return
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise _bad("output_config.format.type: Input should be 'json_schema'")
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise _bad("output_config.format.schema: Input should be a valid dictionary")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise _bad(f"output_config.format.schema: invalid JSON schema: {e.message}") from None
    model = str(body.get("model"))
    if native_support(model) is False:
        raise _bad(f"'{model}' does not support structured outputs (output_config.format)")


def check_forced_tool(body: Any) -> None:
    """With thinking on, the API forces no tool (`tool_choice` any or tool)."""
    if not isinstance(body, dict):
        return
    thinking = body.get("thinking")
    on = isinstance(thinking, dict) and thinking.get("type") not in (None, "disabled")
    choice = body.get("tool_choice")
    if on and isinstance(choice, dict) and choice.get("type") in ("any", "tool"):
        raise _bad("Thinking may not be enabled when tool_choice forces tool use.")
