"""Argument types: every bad value is one precise line, never a traceback or a
silently wrong row (bounded names, UUIDs, ranges, valid UTF-8, known tools)."""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from hango_worker.cli.exits import CliError
from hango_worker.store.json_limits import loads_json
from hango_worker.store.repo import check_new_name
from hango_worker.vocab import RunStatus

MAX_NAME_CHARS = 200
MAX_LIMIT = 10_000
MAX_BATCH_SIZE = 100_000
STATUSES = tuple(str(s) for s in RunStatus)


def _utf8_problem(value: str) -> str | None:
    """Why `value` is not valid UTF-8 text (argv bytes arrive as lone surrogates)."""
    for i, ch in enumerate(value):
        if "\ud800" <= ch <= "\udfff":
            code = ord(ch)
            byte = f"byte 0x{code - 0xDC00:02x}" if code >= 0xDC80 else f"U+{code:04X}"
            return f"is not valid UTF-8 ({byte} at character {i})"
        if ch == "\x00":
            return f"contains a NUL character at {i}, which Postgres cannot store"
    return None


def text(value: str) -> str:
    """Any text argument: valid UTF-8, no NUL."""
    problem = _utf8_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def name(value: str) -> str:
    """An agent or model name: 1-200 printable characters, not only spaces."""
    text(value)
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    if len(value) > MAX_NAME_CHARS:
        raise argparse.ArgumentTypeError(
            f"is {len(value)} characters long; at most {MAX_NAME_CHARS} are allowed"
        )
    bad = next((i for i, ch in enumerate(value) if not ch.isprintable()), None)
    if bad is not None:
        raise argparse.ArgumentTypeError(
            f"contains a control or non-printable character ({value[bad]!a} at {bad})"
        )
    return value


def json_arg(raw: str, what: str) -> Any:
    """A JSON command-line argument, decoded: CliError (one line, exit 2) when it is not
    JSON, nests deeper than MAX_JSON_DEPTH (never a RecursionError), or holds a NUL,
    which Postgres cannot store (store/json_limits.py: the one rule)."""
    try:
        return loads_json(raw, what)
    except ValueError as e:
        raise CliError(str(e)) from None


def new_name(value: str) -> str:
    """The name of a new agent or tenant: a `name`, and not shaped like a UUID (an
    argument that looks like one is always read as an id: names and ids never mix)."""
    name(value)
    try:
        check_new_name("new", value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "looks like a UUID: an agent or tenant name may not (it would read as an id)"
        ) from None
    return value


def a_uuid(what: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        try:
            return str(uuid.UUID(value))
        except ValueError:
            shown = ascii(value) if _utf8_problem(value) else repr(value)
            raise argparse.ArgumentTypeError(f"{shown} is not {what} (a UUID)") from None

    parse.__name__ = what
    return parse


def int_between(low: int, high: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"{n} is out of range: must be {low}-{high}")
        return n

    parse.__name__ = "number"
    return parse


MAX_INPUT_BYTES = 10 * 1024 * 1024  # a run's input message, read from a file or stdin


def _bounded(read: Callable[[int], bytes], what: str) -> bytes:
    """At most MAX_INPUT_BYTES (one byte more tells it is larger): `/dev/zero` or an
    endless pipe is refused in one line, never read without end."""
    raw = read(MAX_INPUT_BYTES + 1)
    if len(raw) > MAX_INPUT_BYTES:
        raise CliError(
            f"{what}: larger than {MAX_INPUT_BYTES // (1024 * 1024)} MiB, the input limit"
        )
    return raw


def read_input(inline: str | None, path: str | None) -> str:
    """The user's message: `--input TEXT`, `--input -` (stdin) or `--input-file PATH`."""
    if path is not None:
        what = f"--input-file {ascii(path) if not path.isprintable() else path}"
        try:
            with open(path, "rb") as f:
                raw = _bounded(f.read, what)
        except OSError as e:
            raise CliError(f"{what}: cannot read it ({e.strerror or e})") from None
        return _decoded(raw, what)
    if inline == "-":
        return _decoded(_bounded(sys.stdin.buffer.read, "--input - (stdin)"), "--input - (stdin)")
    assert inline is not None  # argparse: one of the two is required
    if not inline.strip():
        raise CliError("--input: must not be empty")
    return inline


def _decoded(raw: bytes, what: str) -> str:
    try:
        value = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CliError(
            f"{what}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at {e.start})"
        ) from None
    problem = _utf8_problem(value)
    if problem:
        raise CliError(f"{what}: {problem}")
    if not value.strip():
        raise CliError(f"{what}: the input is empty")
    return value


def check_tools(wanted: Iterable[str], known: list[str]) -> list[str]:
    """The agent's tools, each one this installation knows, none twice."""
    tools = list(wanted)
    seen: set[str] = set()
    for t in tools:
        if t in seen:
            raise CliError(f"--tool {t!r} is listed twice")
        seen.add(t)
        if t not in known:
            raise CliError(
                f"--tool {t!r} is not a known tool; known tools: {', '.join(sorted(known))} "
                "(more come from HANGO_TOOL_MODULES or the hango_worker.tools entry points)"
            )
    return tools


MAX_MEMORY_KEY_CHARS = 200


def memory_key(value: str) -> str:
    """A run's memory key: 1-200 printable characters (e.g. an end user's id)."""
    text(value)
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    if len(value) > MAX_MEMORY_KEY_CHARS:
        raise argparse.ArgumentTypeError(
            f"is {len(value)} characters long; at most {MAX_MEMORY_KEY_CHARS} are allowed"
        )
    bad = next((i for i, ch in enumerate(value) if not ch.isprintable()), None)
    if bad is not None:
        raise argparse.ArgumentTypeError(
            f"contains a control or non-printable character ({value[bad]!a} at {bad})"
        )
    return value


def memory_path(value: str) -> str:
    """A memory file's path: /memories/…, canonical (no '..', '.', empty segments)."""
    from hango_worker.agent.memory_files import MemoryToolError, check_file_path

    text(value)
    try:
        return check_file_path(value)
    except MemoryToolError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
