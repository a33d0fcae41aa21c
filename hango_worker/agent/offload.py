"""The one format of an offloaded tool result, shared by Filesystem (which writes
it) and Summarization (which, clearing an old result, tells the model where the
full text still is). Neither middleware parses the other's private state.
"""

from __future__ import annotations

import re

OFFLOAD_DIR = "/large_tool_results"
_POINTER = re.compile(
    r"^\[tool result offloaded: (?P<size>\d+) bytes stored at (?P<path>\S+); "
    r"read it with read_file\]\n"
)


def offload_path(tool_use_id: str) -> str:
    """Where the full result of call `tool_use_id` is stored (ids are [A-Za-z0-9_-])."""
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", tool_use_id) or "_"
    return f"{OFFLOAD_DIR}/{safe}"


def pointer_text(path: str, size: int, head: str) -> str:
    """What the model sees instead of the full result: one pointer line, then a head."""
    return f"[tool result offloaded: {size} bytes stored at {path}; read it with read_file]\n{head}"


def offloaded(content: str) -> tuple[str, int] | None:
    """(path, size) when `content` is an offload pointer, else None."""
    m = _POINTER.match(content)
    return (m["path"], int(m["size"])) if m else None
