"""`enqueue --attach PATH` and `--input-json FILE|-`: a run's content blocks
(docs/inputs-and-outputs.md). Every problem is one line (CliError, exit 2)."""

from __future__ import annotations

import sys
from typing import Any

from hango_worker.cli.exits import CliError
from hango_worker.cli.inputs import json_arg
from hango_worker.provider.content import attachment, check_input_blocks

MAX_READ_BYTES = 32 * 1024 * 1024  # the API's request size limit: no input is larger


def _shown(path: str) -> str:
    return ascii(path) if not path.isprintable() else path


def _read(path: str, what: str) -> bytes:
    try:
        if path == "-":
            raw = sys.stdin.buffer.read(MAX_READ_BYTES + 1)
        else:
            with open(path, "rb") as f:
                raw = f.read(MAX_READ_BYTES + 1)
    except OSError as e:
        raise CliError(f"{what}: cannot read it ({e.strerror or e})") from None
    if len(raw) > MAX_READ_BYTES:
        raise CliError(f"{what}: larger than 32 MiB, the API's request size limit")
    return raw


def read_content(attach: list[str] | None, input_json: str | None) -> list[dict[str, Any]] | None:
    """The content blocks given: `--input-json`'s blocks, then one block per `--attach`
    file (image or PDF document, its media type sniffed from its bytes); None if none."""
    blocks: list[dict[str, Any]] = []
    if input_json is not None:
        what = f"--input-json {_shown(input_json)}"
        raw = _read(input_json, what)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CliError(f"{what}: not valid UTF-8") from None
        value = json_arg(text, what)
        if isinstance(value, dict) and "content" in value:
            value = value["content"]
        if not isinstance(value, list):
            raise CliError(f'{what}: give a JSON list of content blocks (or {{"content": [...]}})')
        blocks.extend(value)
    for path in attach or []:
        what = f"--attach {_shown(path)}"
        try:
            blocks.append(attachment(_read(path, what), path.rsplit("/", 1)[-1]))
        except ValueError as e:
            raise CliError(f"--attach {e}") from None
    if not blocks:
        return None
    try:
        check_input_blocks(blocks)
    except ValueError as e:
        raise CliError(str(e)) from None
    return blocks


def given_text(a: Any) -> bool:
    """Whether `enqueue` was given a message (`--input` or `--input-file`)."""
    return a.input is not None or a.input_file is not None
