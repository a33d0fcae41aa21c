"""The memory tool's file semantics, without storage: paths, listings, edits.

Commands, arguments and result wording follow Anthropic's memory tool
(`memory_20250818`: view, create, str_replace, insert, delete, rename over
`/memories/...`), as its reference client implementation in the `anthropic` SDK
words them. Where hango differs it says so in the message (e.g. a conflict).
"""

from __future__ import annotations

from collections.abc import Sequence

from hango_worker.agent.ports import MemoryEntry

ROOT = "/memories"
# One memory file holds at most this many bytes of UTF-8: memory is notes, not
# documents, and the whole index of a scope is loaded at every attempt.
MAX_FILE_BYTES = 64 * 1024
MAX_PATH_CHARS = 512
MAX_NAME_CHARS = 255
LINE_NUMBER_WIDTH = 6


class MemoryToolError(Exception):
    """A bad command: its message is the tool's error result."""


def check_path(path: object, arg: str = "path") -> str:
    """The canonical form of a path under /memories (no trailing slash), or an error.

    Nothing is resolved: `..`, `.`, empty segments and backslashes are refused
    outright, so no spelling of a path can leave /memories."""
    if not isinstance(path, str) or not path:
        raise MemoryToolError(f"`{arg}` must be a path under {ROOT}, e.g. {ROOT}/notes.md")
    if path != ROOT and not path.startswith(ROOT + "/"):
        raise MemoryToolError(f"Path must start with {ROOT}, got: {path}")
    if len(path) > MAX_PATH_CHARS:
        raise MemoryToolError(f"Path is {len(path)} characters long; at most {MAX_PATH_CHARS}")
    canonical = path.rstrip("/") or ROOT
    for part in canonical[len(ROOT) :].split("/")[1:]:
        if part in ("", ".", ".."):
            raise MemoryToolError(
                f"Path {path} would escape {ROOT} directory or is not canonical "
                "('.', '..' and empty segments are not allowed)"
            )
        if "\\" in part or any(not ch.isprintable() for ch in part):
            raise MemoryToolError(
                f"Path {path!a} contains a backslash or a control character; use plain names"
            )
        if len(part) > MAX_NAME_CHARS:
            raise MemoryToolError(f"A name in {path} is longer than {MAX_NAME_CHARS} characters")
    return canonical


def check_file_path(path: object, arg: str = "path") -> str:
    p = check_path(path, arg)
    if p == ROOT:
        raise MemoryToolError(f"{ROOT} is the memory directory itself, not a file")
    return p


def ancestors(path: str) -> list[str]:
    """The directories above `path` inside /memories: /memories/a/b/c gives /memories/a
    and /memories/a/b."""
    parts = path[len(ROOT) + 1 :].split("/")
    return [ROOT + "/" + "/".join(parts[:i]) for i in range(1, len(parts))]


def file_in_the_way(path: str, file: str) -> MemoryToolError:
    return MemoryToolError(
        f"No change was made: {file} is a file, so {path} cannot be made inside it (a "
        "memory path is a file or a directory, never both). Choose another path, or "
        f"rename {file} first."
    )


def also_a_directory(path: str, listing_text: str) -> str:
    """The note after a file's view when files also exist below its path (made before
    paths were checked, or by two runs at once): nothing is hidden."""
    return (
        f"\n\nNote: {path} is also a directory; the files below it (view each by its "
        f"path):\n{listing_text}"
    )


def check_size(path: str, content: str) -> int:
    size = len(content.encode("utf-8", errors="replace"))
    if size > MAX_FILE_BYTES:
        raise MemoryToolError(
            f"No change was made: {path} would be {size} bytes, over the limit of "
            f"{MAX_FILE_BYTES} bytes per memory file. Keep memory files short: split the "
            "text into several files or summarise it."
        )
    return size


def format_size(n: int) -> str:
    if n == 0:
        return "0B"
    units = ["B", "K", "M", "G"]
    i = min((n.bit_length() - 1) // 10, len(units) - 1)
    v = n / (1024**i)
    return f"{int(v)}{units[i]}" if v == int(v) else f"{v:.1f}{units[i]}"


def listing(path: str, entries: Sequence[MemoryEntry], more: bool) -> str:
    """`view` of a directory: files and directories up to 2 levels deep below it."""
    base = path.rstrip("/") + "/"
    rows: dict[str, int] = {}
    total = 0
    for e in entries:
        rel = e.path[len(base) :].split("/")
        total += e.size
        for depth in range(1, min(len(rel), 2) + 1):
            name = "/".join(rel[:depth]) + ("/" if depth < len(rel) else "")
            rows[name] = rows.get(name, 0) + e.size
    head = (
        f"Here're the files and directories up to 2 levels deep in {path}, excluding hidden items:"
    )
    hidden = {n for n in rows if any(p.startswith(".") for p in n.split("/"))}
    lines = [f"{format_size(total)}\t{path}"]
    lines += [f"{format_size(rows[n])}\t{base}{n}" for n in sorted(rows) if n not in hidden]
    if more:
        lines.append(f"(more files than shown: view a subdirectory of {path})")
    return head + "\n" + "\n".join(lines)


def numbered(path: str, content: str, view_range: object = None) -> str:
    """`view` of a file: its lines, numbered (optionally a [start, end] range, end -1 = last)."""
    lines = content.split("\n")
    start, end = 1, len(lines)
    if view_range is not None:
        if not (
            isinstance(view_range, list)
            and len(view_range) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in view_range)
        ):
            raise MemoryToolError("`view_range` must be two line numbers [start, end]")
        start = max(1, view_range[0])
        end = len(lines) if view_range[1] == -1 else min(view_range[1], len(lines))
        if start > end:
            raise MemoryToolError(
                f"Invalid `view_range` {view_range}: the file has {len(lines)} lines"
            )
    shown = [f"{str(i).rjust(LINE_NUMBER_WIDTH)}\t{lines[i - 1]}" for i in range(start, end + 1)]
    return f"Here's the content of {path} with line numbers:\n" + "\n".join(shown)


def replaced(path: str, content: str, old: str, new: str) -> tuple[str, str]:
    """(new content, the result text) of `str_replace`; old must occur exactly once."""
    count = content.count(old) if old else 0
    if count == 0:
        raise MemoryToolError(
            f"No replacement was performed, old_str `{old}` did not appear verbatim in {path}."
        )
    if count > 1:
        at, lines = 0, []
        while (at := content.find(old, at)) != -1:
            lines.append(content[:at].count("\n") + 1)
            at += 1
        raise MemoryToolError(
            f"No replacement was performed. Multiple occurrences of old_str `{old}` in lines: "
            f"{', '.join(map(str, lines))}. Please ensure it is unique"
        )
    changed = content[: content.find(old)].count("\n")
    out = content.replace(old, new)
    new_lines = out.split("\n")
    lo, hi = max(0, changed - 2), min(len(new_lines), changed + 3)
    snippet = [
        f"{str(n).rjust(LINE_NUMBER_WIDTH)}\t{new_lines[n - 1]}" for n in range(lo + 1, hi + 1)
    ]
    text = (
        "The memory file has been edited. Here is the snippet showing the change "
        "(with line numbers):\n" + "\n".join(snippet)
    )
    return out, text


def inserted(path: str, content: str, line: object, text: str) -> str:
    """New content of `insert`: `text` after line `line` (0 = at the top)."""
    lines = content.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not isinstance(line, int) or isinstance(line, bool) or not 0 <= line <= len(lines):
        raise MemoryToolError(
            f"Invalid `insert_line` parameter: {line}. "
            f"It should be within the range [0, {len(lines)}]."
        )
    lines.insert(line, text.rstrip("\n"))
    return "\n".join(lines) + "\n"
