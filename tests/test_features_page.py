"""docs/claude-features.md stays true: it lists every content block type and every
request parameter the installed SDK knows, every test it names exists, and the
operators' guide links to it."""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path
from typing import Any, get_args, get_origin

from anthropic.types import ContentBlock
from anthropic.types.beta import BetaContentBlock

from hango_worker.provider import params as api

ROOT = Path(__file__).resolve().parent.parent
PAGE = (ROOT / "docs" / "claude-features.md").read_text()


def block_types(union: Any) -> set[str]:
    while get_origin(union) is typing.Annotated:
        union = get_args(union)[0]
    out: set[str] = set()
    for member in get_args(union):
        out |= {str(t) for t in get_args(member.model_fields["type"].annotation)}
    return out


def rows() -> set[str]:
    """The first cell of every table row, each backticked name in it."""
    firsts = [ln.split("|")[1] for ln in PAGE.splitlines() if ln.startswith("| ")]
    return {name for cell in firsts for name in re.findall(r"`([^`]+)`", cell)}


def test_every_block_type_the_sdk_knows_has_a_row() -> None:
    known = block_types(ContentBlock) | block_types(BetaContentBlock)
    assert {"text", "thinking", "redacted_thinking", "compaction"} <= known
    assert known - rows() == set()


def test_every_request_parameter_the_sdk_knows_has_a_row() -> None:
    assert (api.ALL_PARAMS | api.OWNED) - rows() == set()


def test_every_test_the_page_names_exists() -> None:
    named = set(re.findall(r"(tests/[\w/]+\.py)::(\w+)", PAGE))
    assert len(named) >= 10
    for path, name in named:
        tree = ast.parse((ROOT / path).read_text())
        defined = {
            n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        assert name in defined, f"{path}::{name}"
    for stream in set(re.findall(r"replay\[(\w+)\]", PAGE)) - {"NAME"}:
        assert (ROOT / "tests" / "streams" / f"{stream}.sse").is_file(), stream


def test_the_operators_guide_links_the_page() -> None:
    assert "(claude-features.md)" in (ROOT / "docs" / "operations.md").read_text()
