"""How a command prints its result: JSON (`--json`), or a line per row."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hango_worker.cli import exits


def out(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def print_rows(rows: list[dict[str, Any]], as_json: bool, line: Callable[[Any], str]) -> int:
    """A listing: the rows as JSON (`--json`), else one `line(row)` each."""
    if as_json:
        out(rows)
    else:
        for r in rows:
            print(line(r))
    return exits.OK
