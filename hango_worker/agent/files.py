"""Run files as the agent sees them: paths, pages of numbered lines, grep, edits.

Pure functions behind the Filesystem middleware's tools (`middlewares/filesystem.py`).
Every problem is a `FileError` whose message is what the model reads; nothing
here touches storage.

The limits, documented in docs/system-architecture.md ("Run files"):

- a path is absolute (`/notes/plan.md`), at most `MAX_PATH_CHARS` characters,
  without control characters or `..`; it is normalised (`//` and `/./` collapse,
  a trailing `/` goes);
- `read_file` shows lines numbered from 1 (`offset` is 0-based: offset 0 is
  line 1), `limit` lines (default `DEFAULT_LIMIT`, at most `MAX_LIMIT`), each cut
  at `LINE_WIDTH` characters with a note of how much was cut, the page at most
  about `PAGE_CHARS` characters; a page that stops before the end says which
  offset reads on. Lines are the text split at `\\n`, so pages joined with `\\n`
  give the content back exactly (a final newline shows as a last, empty line);
- `grep` uses Python `re` on each line, shows at most `MAX_GREP_MATCHES` matches,
  and runs in a child process stopped after `GREP_TIMEOUT_S`: a pattern that
  backtracks exponentially (`(a+)+$`) would otherwise hold the worker's event
  loop, and with it every run of the worker;
- one `write_file` or `edit_file` result holds at most `MAX_FILE_BYTES` bytes
  of UTF-8.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import re
import sys
from collections.abc import Iterable
from typing import Any

MAX_PATH_CHARS = 1024
MAX_FILE_BYTES = 1_000_000
LINE_WIDTH = 2000
DEFAULT_LIMIT = 500
MAX_LIMIT = 2000
PAGE_CHARS = 100_000
MAX_GREP_MATCHES = 100
GREP_LINE_WIDTH = 300
MAX_PATTERN_CHARS = 1000
GREP_TIMEOUT_S = 10.0
MAX_LS_ENTRIES = 1000
HEAD_CHARS = 1000


class FileError(ValueError):
    """A file tool cannot do what was asked; the message says why, for the model."""


def utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def norm_path(raw: Any, *, directory: bool = False) -> str:
    """The normalised absolute path, or FileError naming what is wrong with it."""
    if not isinstance(raw, str) or not raw:
        raise FileError("path must be a non-empty string, an absolute path like /notes/plan.md")
    if len(raw) > MAX_PATH_CHARS:
        raise FileError(f"path is {len(raw)} characters long; at most {MAX_PATH_CHARS} are allowed")
    if any(ch < " " or "\x7f" <= ch <= "\x9f" for ch in raw):
        raise FileError(f"path {raw!r} contains control characters")
    if not raw.startswith("/"):
        raise FileError(f"path {raw!r} is not absolute: it must start with / (e.g. /{raw})")
    if ".." in raw.split("/"):
        raise FileError(f"path {raw!r} contains '..'; use an absolute path without '..'")
    path = "/" + posixpath.normpath(raw).lstrip("/")
    if path == "/" and not directory:
        raise FileError("path '/' is the root directory, not a file; name a file like /notes.md")
    return path


def in_directory(path: str, directory: str) -> bool:
    return directory == "/" or path == directory or path.startswith(directory + "/")


def cut(line: str, width: int = LINE_WIDTH) -> str:
    if len(line) <= width:
        return line
    return f"{line[:width]} [… {len(line) - width} more characters of this line not shown]"


def _int_arg(value: Any, name: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise FileError(f"{name} must be a whole number; got {value!r}")
    return value


def page(lines: list[str], offset: Any, limit: Any) -> str:
    """Lines `offset` … `offset + limit - 1` (0-based), numbered from 1, bounded."""
    offset = _int_arg(offset, "offset", 0)
    limit = _int_arg(limit, "limit", DEFAULT_LIMIT)
    if offset < 0:
        raise FileError(f"offset must be 0 or more (offset 0 is the first line); got {offset}")
    if not 1 <= limit <= MAX_LIMIT:
        raise FileError(f"limit must be between 1 and {MAX_LIMIT} lines; got {limit}")
    n = len(lines)
    if offset >= n:
        raise FileError(
            f"offset {offset} is past the end of the file: it has {n} lines (offsets 0-{n - 1})"
        )
    out: list[str] = []
    used = 0
    i = offset
    end = min(n, offset + limit)
    while i < end:
        row = f"{i + 1:6d}\t{cut(lines[i])}"
        if out and used + len(row) + 1 > PAGE_CHARS:
            break
        out.append(row)
        used += len(row) + 1
        i += 1
    if i < n:
        out.append(f"[lines {offset + 1}-{i} of {n} shown; read on with offset={i}]")
    return "\n".join(out)


def compile_pattern(pattern: Any) -> re.Pattern[str]:
    if not isinstance(pattern, str) or not pattern:
        raise FileError("pattern must be a non-empty regular expression (Python re syntax)")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise FileError(f"pattern is {len(pattern)} characters; at most {MAX_PATTERN_CHARS}")
    try:
        return re.compile(pattern)
    except re.error as e:
        raise FileError(
            f"invalid regular expression {pattern!r}: {e} (Python re syntax; "
            "escape special characters such as ( [ . * with a backslash)"
        ) from None


def grep(rx: re.Pattern[str], files: Iterable[tuple[str, str]]) -> str:
    """`path:line: text` for each matching line, the first MAX_GREP_MATCHES shown."""
    shown: list[str] = []
    total = searched = 0
    for path, content in files:
        searched += 1
        for i, line in enumerate(content.split("\n")):
            if rx.search(line) is not None:
                total += 1
                if len(shown) < MAX_GREP_MATCHES:
                    shown.append(f"{path}:{i + 1}: {cut(line, GREP_LINE_WIDTH)}")
    if not shown:
        return f"no line matches {rx.pattern!r} in {searched} file(s)"
    if total > len(shown):
        shown.append(
            f"[{total - len(shown)} more matching lines not shown; narrow the pattern or the path]"
        )
    return "\n".join(shown)


_CHILD = "from hango_worker.agent.files import grep_stdin; grep_stdin()"


def grep_stdin() -> None:
    """The child process of `grep_isolated`: {pattern, files} on stdin, the answer out."""
    req = json.load(sys.stdin)
    rx = re.compile(req["pattern"])
    sys.stdout.write(grep(rx, [(p, c) for p, c in req["files"]]))


async def grep_isolated(
    rx: re.Pattern[str], files: list[tuple[str, str]], timeout_s: float | None = None
) -> str:
    """`grep` in a child process, killed after `timeout_s` (default GREP_TIMEOUT_S) or
    when the call is cancelled."""
    timeout_s = GREP_TIMEOUT_S if timeout_s is None else timeout_s
    payload = json.dumps({"pattern": rx.pattern, "files": files}).encode()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CHILD,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(payload), timeout_s)
    except TimeoutError:
        raise FileError(
            f"matching {rx.pattern!r} took longer than {timeout_s:g} s and was stopped (nested "
            "repetition such as (a+)+ can take exponential time); simplify the pattern or "
            "narrow the path"
        ) from None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        last = err.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        raise FileError(f"grep failed: {last[0][:300]}")
    return out.decode()


def edit(
    content: str,
    path: str,
    old: Any,
    new: Any,
    replace_all: Any,
    max_bytes: int = MAX_FILE_BYTES,
) -> tuple[str, int]:
    """(the edited content, how many occurrences were replaced); FileError, before any
    allocation, when the result would pass `max_bytes`."""
    if not isinstance(old, str) or not old:
        raise FileError("old_string must be a non-empty string: the exact text to replace")
    if not isinstance(new, str):
        raise FileError("new_string must be a string")
    n = content.count(old)
    if n == 0:
        raise FileError(
            f"old_string was not found in {path}; read the file and copy the exact text, "
            "whitespace and line breaks included; nothing was changed"
        )
    if n > 1 and replace_all is not True:
        raise FileError(
            f"old_string occurs {n} times in {path}; include more surrounding text so it is "
            "unique, or set replace_all to true; nothing was changed"
        )
    # checked before the replacement is made: a short old_string and a long new_string
    # could otherwise build a string of gigabytes in one call (n copies of new_string)
    done = n if replace_all is True else 1
    size = utf8_size(content) + done * (utf8_size(new) - utf8_size(old))
    if size > max_bytes:
        raise FileError(
            f"the edit would make {path} {size} bytes ({done} replacement(s)); a file holds "
            f"at most {max_bytes} bytes; nothing was changed"
        )
    return (content.replace(old, new) if replace_all is True else content.replace(old, new, 1)), n


def head(content: str, chars: int = HEAD_CHARS) -> str:
    """The start of `content` shown beside an offload pointer, ending on a line boundary
    when one falls in the second half of the window."""
    if len(content) <= chars:
        return content
    h = content[:chars]
    nl = h.rfind("\n")
    return h[:nl] if nl >= chars // 2 else h
