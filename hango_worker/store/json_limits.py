"""The one rule for JSON a caller hands in (CLI arguments, the `Client`, the console):
at most MAX_JSON_DEPTH levels of nesting and no NUL character, checked iteratively, so
no input ends in a RecursionError. The SQL producer API applies the same depth in SQL
(migration 0013: `hango_json_too_deep`); docs/operations.md "Trust model"."""

from __future__ import annotations

import json
from typing import Any

MAX_JSON_DEPTH = 64  # the root is level 1; a value inside it level 2, …


def nested_too_deep(what: str) -> str:
    return f"{what}: nested more than {MAX_JSON_DEPTH} levels deep"


def check_json(value: Any, what: str) -> None:
    """ValueError (one line naming `what`) when `value` nests deeper than MAX_JSON_DEPTH
    or holds a NUL, which Postgres cannot store. A value that contains itself is nested
    without end: refused like any other too deep."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:  # iterative: the check itself never recurses
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(nested_too_deep(what))
        if isinstance(item, str) and "\x00" in item:
            raise ValueError(f"{what}: holds a NUL character (\\u0000), which cannot be stored")
        if isinstance(item, dict):
            stack.extend((k, depth) for k in item)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((v, depth + 1) for v in item)


def loads_json(raw: str, what: str) -> Any:
    """`raw` decoded and checked (`check_json`): ValueError in one line when it is not
    JSON, nests too deep (never a RecursionError) or holds a NUL."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValueError(nested_too_deep(what)) from None
    except ValueError as e:
        raise ValueError(f"{what}: {e} (not valid JSON)") from None
    check_json(value, what)
    return value
