"""Content blocks as run input (docs/inputs-and-outputs.md).

- `INPUT_BLOCK_TYPES`: the block types a run's input may hold — every member of the
  installed SDK's user-message content union (`UserMessageParam.content`) but the ones
  bound to a conversation's own calls and turns (tool uses and results, thinking), read
  from the SDK's types, never from a list copied by hand.
- `check_input_blocks`: each block validated against the SDK's own request TypedDict
  for its type (pydantic, as provider/params.py does for parameters) and its top-level
  keys against that TypedDict's; one line naming the block by index. The limits the API
  documents (media types, sizes, base64, PDF pages, the request size) are checked where
  every producer passes, in SQL (`hango_check_content`, migration 0016).
- `sniff`: a file's media type from its first bytes (PNG, JPEG, GIF, WebP, PDF).
- Stored once: a base64 source of at least `BLOB_MIN_CHARS` characters is kept in the
  `blobs` table (by tenant and sha256) and the block in history holds a reference
  (`source.hango_blob`, `source.size`) instead of `data`; `inline` puts the bytes back
  for a request, `blob_ref` reads a reference.
"""

from __future__ import annotations

import base64
import hashlib
import typing
from functools import cache
from typing import Any, get_args, get_origin

from anthropic.types import ToolResultBlockParam, user_message_param
from pydantic import TypeAdapter, ValidationError

BLOB_KEY = "hango_blob"  # in a stored block's source: the sha256 (hex) of its bytes
BLOB_MIN_CHARS = 16384  # base64 characters from which a source is stored once, by hash

# Magic numbers (the files' own formats): what the API takes as image and PDF input.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
)


def sniff(data: bytes) -> str | None:
    """The media type `data` is by its first bytes, or None."""
    for magic, media_type in _MAGIC:
        if data.startswith(magic):
            return media_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _literals(hint: Any) -> tuple[str, ...]:
    while get_origin(hint) in (typing.Required, typing.NotRequired, typing.Annotated):
        hint = get_args(hint)[0]
    return tuple(str(a) for a in get_args(hint)) if get_origin(hint) is typing.Literal else ()


def _hints(td: type) -> dict[str, Any]:
    return typing.get_type_hints(td, include_extras=True)


def _conversation_bound(kind: str) -> bool:
    """Blocks that answer or carry a turn's own calls or reasoning: never run input."""
    return kind.endswith(("tool_use", "tool_result")) or "thinking" in kind


@cache
def input_block_types() -> dict[str, type]:
    """{type: the SDK's TypedDict} for every block a run's input may hold."""
    content = _hints(user_message_param.UserMessageParam)["content"]
    while get_origin(content) in (typing.Required, typing.NotRequired):
        content = get_args(content)[0]
    iterable = next(a for a in get_args(content) if get_origin(a) is not None)
    out: dict[str, type] = {}
    for member in get_args(get_args(iterable)[0]):
        if not (isinstance(member, type) and hasattr(member, "__required_keys__")):
            continue  # the response models the SDK also accepts
        for kind in _literals(_hints(member).get("type")):
            if not _conversation_bound(kind):
                out[kind] = member
    return out


@cache
def result_block_types() -> dict[str, type]:
    """{type: the SDK's TypedDict} for every block a tool result's content may hold."""
    content = _hints(ToolResultBlockParam)["content"]
    iterable = next(a for a in get_args(content) if get_origin(a) is not None)
    out: dict[str, type] = {}
    for member in get_args(get_args(iterable)[0]):
        for kind in _literals(_hints(member).get("type")):
            out[kind] = member
    return out


@cache
def _adapter(td: type) -> TypeAdapter[Any]:
    return TypeAdapter(td)


def media_types(block_type: str, source_type: str = "base64") -> tuple[str, ...]:
    """The media types the SDK's types allow for a block's source of `source_type`."""
    td = input_block_types()[block_type]
    source = _hints(td)["source"]
    while get_origin(source) in (typing.Required, typing.NotRequired):
        source = get_args(source)[0]
    for member in get_args(source) or (source,):
        hints = _hints(member)
        if source_type in _literals(hints.get("type")):
            return _literals(hints.get("media_type"))
    return ()


def _best_error(e: ValidationError, value: Any) -> dict[str, Any]:
    """The first error along the union members the value's own `type`s name."""
    errors = e.errors()
    for err in errors:
        sub, ok = value, True
        for part in err["loc"]:
            if isinstance(part, str) and part[:1].isupper():  # a union member's name
                kind = sub.get("type") if isinstance(sub, dict) else None
                ok = kind is not None and f"{str(kind).replace('_', '')}" in part.lower()
                if not ok:
                    break
            elif isinstance(sub, dict):
                sub = sub.get(part)
            elif isinstance(sub, list) and isinstance(part, int) and part < len(sub):
                sub = sub[part]
        if ok:
            return dict(err)
    return dict(errors[0])


def check_input_blocks(
    blocks: Any, where: str = "input.content", known: dict[str, type] | None = None
) -> None:
    """ValueError, one line naming the block by index, for what the SDK's types refuse."""
    if not isinstance(blocks, list) or not blocks:
        raise ValueError(f"{where} must be a non-empty list of content blocks")
    known = known if known is not None else input_block_types()
    for i, block in enumerate(blocks):
        at = f"{where}[{i}]"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise ValueError(f"{at}: a content block is an object with a string 'type'")
        kind = block["type"]
        td = known.get(kind)
        if td is None:
            raise ValueError(
                f"{at}: type {kind!r} is not a block {where} may hold ({', '.join(sorted(known))})"
            )
        extra = sorted(set(block) - set(_hints(td)))
        if extra:
            raise ValueError(f"{at} ({kind}): unknown key {extra[0]!r}")
        source = block.get("source")
        if isinstance(source, dict) and BLOB_KEY in source:
            raise ValueError(f"{at} ({kind}): source.{BLOB_KEY} is reserved for stored blocks")
        try:
            _adapter(td).validate_python(block)
        except ValidationError as e:
            err = _best_error(e, block)
            loc = [str(p) for p in err["loc"] if not str(p)[:1].isupper()]
            raise ValueError(f"{at} ({kind}): {'.'.join(loc) or kind}: {err['msg']}") from None


def attachment(data: bytes, name: str) -> dict[str, Any]:
    """An image or PDF document block of a file's bytes (media type from the bytes);
    ValueError naming the file when it is neither."""
    media_type = sniff(data)
    if media_type is None:
        raise ValueError(
            f"{name}: not a PNG, JPEG, GIF, WebP or PDF file (by its first bytes); "
            "give other content with --input-json"
        )
    source = {
        "type": "base64",
        "media_type": media_type,
        "data": base64.b64encode(data).decode("ascii"),
    }
    if media_type == "application/pdf":
        return {"type": "document", "source": source, "title": name}
    return {"type": "image", "source": source}


def blob_ref(block: dict[str, Any]) -> str | None:
    """The sha256 (hex) a stored block refers to, or None."""
    source = block.get("source")
    if isinstance(source, dict):
        ref = source.get(BLOB_KEY)
        if isinstance(ref, str):
            return ref
    return None


def inline(block: dict[str, Any], b64: str) -> dict[str, Any]:
    """The block as sent: its reference replaced by the bytes (base64, encoded once)."""
    source = {k: v for k, v in block["source"].items() if k not in (BLOB_KEY, "size")}
    source["data"] = b64
    return {**block, "source": source}


def describe(block: dict[str, Any]) -> str:
    """One line for people (runs show, the console): type, name, media type, size;
    never the bytes."""
    kind = str(block.get("type"))
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    assert isinstance(source, dict)
    parts = [kind]
    if isinstance(block.get("title"), str):
        parts.append(repr(block["title"]))
    if source.get("media_type"):
        parts.append(str(source["media_type"]))
    size = source.get("size")
    if isinstance(source.get("data"), str):
        data = source["data"]
        size = (
            len(data) * 3 // 4 - data[-2:].count("=")
            if source.get("type") == "base64"
            else len(data)
        )
    if isinstance(size, int):
        parts.append(_size(size))
    if isinstance(source.get(BLOB_KEY), str):
        parts.append(f"sha256 {source[BLOB_KEY][:12]}")
    if isinstance(source.get("url"), str):
        parts.append(source["url"])
    if isinstance(block.get("source"), str):  # a search result's source
        parts.append(block["source"])
    if isinstance(block.get("file_id"), str):
        parts.append(block["file_id"])
    return " ".join(parts)


def without_bytes(value: Any) -> Any:
    """`value` (a message's content, a run's record) with every inline base64 `data` of a
    block's source replaced by its size (`size`, bytes) and `data_omitted: true`: what
    `runs show --json` prints, so a transcript never carries an attachment's bytes to a
    terminal. The stored content is not changed; `--with-bytes` prints it as stored."""
    if isinstance(value, list):
        return [without_bytes(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: without_bytes(v) for k, v in value.items()}
    source = value.get("source")
    if isinstance(source, dict) and source.get("type") == "base64" and "data" in source:
        data = source["data"]
        trimmed = {k: v for k, v in source.items() if k != "data"}
        if isinstance(data, str):
            trimmed["size"] = len(data) * 3 // 4 - data[-2:].count("=")
        out["source"] = {**trimmed, "data_omitted": True}
    return out


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def store_form(blocks: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Blob]]:
    """`blocks` as stored: each base64 source of at least BLOB_MIN_CHARS characters as a
    reference (sha256 and size instead of data), and the blobs to store for them."""
    out: list[dict[str, Any]] = []
    blobs: list[Blob] = []
    for b in blocks:
        source = b.get("source")
        data = source.get("data") if isinstance(source, dict) else None
        if not (isinstance(source, dict) and source.get("type") == "base64"):
            out.append(b)
            continue
        if not isinstance(data, str) or len(data) < BLOB_MIN_CHARS:
            out.append(b)
            continue
        raw = base64.b64decode(data, validate=True)
        blob = Blob(hashlib.sha256(raw).digest(), str(source.get("media_type", "")), raw)
        blobs.append(blob)
        ref = {k: v for k, v in source.items() if k != "data"}
        ref.update({BLOB_KEY: blob.sha256.hex(), "size": len(raw)})
        out.append({**b, "source": ref})
    return out, blobs


class Blob(typing.NamedTuple):
    """The bytes of a block stored once: by sha256 (32 bytes), with the media type."""

    sha256: bytes
    media_type: str
    data: bytes


def result_text(blocks: list[dict[str, Any]]) -> str:
    """A block result as text (logs, spans, the offload rule): its text, a line per
    other block (provider/content.py `describe`)."""
    return "\n".join(
        str(b.get("text", "")) if b.get("type") == "text" else f"[{describe(b)}]" for b in blocks
    )


def media_block(data: bytes, media_type: str | None = None) -> dict[str, Any]:
    """An image or PDF document block of bytes (media type from the bytes unless given)."""
    kind = media_type or sniff(data)
    if kind is None:
        raise ValueError(
            "a tool result must be str, ToolResult, JSON data, content blocks or the bytes "
            "of an image or PDF; got bytes that are not a PNG, JPEG, GIF, WebP or PDF "
            "(return (bytes, media_type) to name another)"
        )
    source = {"type": "base64", "media_type": kind, "data": base64.b64encode(data).decode()}
    return {"type": "document" if kind == "application/pdf" else "image", "source": source}
