"""Structured final answers (docs/structured-output.md): the JSON Schema an agent's
answer must match, which models take the API's structured outputs
(`output_config.format`), the schema sent there, and the checks of an answer.

- `check_schema`: ValueError, one line, for an `output_schema` that is not a valid JSON
  Schema (the validator's own meta-schema check) or refers to another document.
- `native_support(model)`: True for the models the Messages API documents structured
  outputs for (Claude Haiku, Sonnet and Opus 4.5 and every later one), False for the
  ones before them, None for a name it does not know (a test model, a new family).
- `output_format(schema)`: the `output_config.format` value, built by the installed
  SDK's own `transform_schema` (every object closed, the keywords the API cannot enforce
  moved into descriptions); the answer is still checked against the agent's schema.
- `violation(schema, value)`: the first problem as (JSON path, message), or None.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import anthropic
import jsonschema
from jsonschema.exceptions import best_match

# Claude 4.5 and later (haiku, sonnet, opus): structured outputs documented as available
_NATIVE = re.compile(r"claude-(?:opus|sonnet|haiku)-(?:4-[5-9]|[5-9])(?:\b|-|$)")
# the models before them: Claude 3.x, Claude 2, Opus and Sonnet 4 / 4.1
_OLDER = re.compile(
    r"claude-(?:instant|2|3)(?:\b|[-.])|claude-(?:opus|sonnet)-4(?:-[0-4])?(?:-\d{8})?(?:\b|$)"
)
MAX_MESSAGE = 500  # characters of the validator's message told to the model


def native_support(model: str) -> bool | None:
    """Whether `model` takes `output_config.format` (None: a model this code does not know)."""
    if _NATIVE.search(model):
        return True
    if _OLDER.search(model):
        return False
    return None


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def check_schema(schema: Any) -> None:
    """ValueError, one line, when `schema` is not a JSON Schema hango can check answers by."""
    if not isinstance(schema, dict):
        raise ValueError(f"must be a JSON Schema object, got {type(schema).__name__}")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "".join(f"[{p!r}]" for p in e.absolute_path) or "(root)"
        raise ValueError(f"not a valid JSON Schema at {where}: {_short(e.message)}") from None
    for ref in _refs(schema):
        if not ref.startswith("#"):
            raise ValueError(f"$ref {ref!r} points outside the schema; only '#...' refs are read")


def output_format(schema: dict[str, Any]) -> dict[str, Any]:
    """The `output_config.format` for `schema` (ValueError: the SDK cannot express it)."""
    return {"type": "json_schema", "schema": anthropic.transform_schema(schema)}


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


@dataclass(frozen=True, slots=True)
class Violation:
    """Where an answer breaks the schema (`path`: a JSON path, `$.items[2].price`) and what
    the validator says."""

    path: str
    message: str


def violation(schema: dict[str, Any], value: Any) -> Violation | None:
    """The validator's most relevant complaint about `value`, or None when it matches."""
    validator = _validator(json.dumps(schema, sort_keys=True))
    try:
        err = best_match(validator.iter_errors(value))
    except Exception as e:  # an unresolvable '#' ref, a pattern Python's re refuses
        return Violation("$", _short(f"the schema cannot be evaluated: {e}"))
    if err is None:
        return None
    return Violation(err.json_path, _short(err.message))


def parse_answer(text: str) -> tuple[Any, Violation | None]:
    """The answer text as JSON, or the parse error as a violation at `$`."""
    try:
        return json.loads(text), None
    except ValueError as e:
        return None, Violation("$", f"the answer is not valid JSON: {e}")
    except RecursionError:
        return None, Violation("$", "the answer is not valid JSON: nested too deeply")


def _short(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"
