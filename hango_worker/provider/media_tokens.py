"""The input tokens of an image or a PDF, as the API documents them
(docs/inputs-and-outputs.md, "Tokens of images and documents").

- An image: about `width * height / 750` tokens, the dimensions read from the file's
  header (PNG, JPEG, GIF, WebP: only the first bytes are decoded), at most
  `IMAGE_MAX_TOKENS` (the API scales a larger image down to about 1.15 megapixels
  first). Dimensions that cannot be read (a URL, a Files API file, a header not
  understood): `IMAGE_MAX_TOKENS`, the most an image can cost.
- A PDF: per page, the page's text (1,500 to 3,000 tokens: `PDF_PAGE_TEXT_TOKENS`, the
  middle) plus the page as an image (`IMAGE_MAX_TOKENS`); the pages counted as the SQL
  check counts them (page objects in the file's uncompressed text), at least one.
- A plain-text document: its text's characters (the caller's ratio makes them tokens).

The base64 of a block is never counted as text. A block stored once (provider/content.py)
is estimated once per process, by its sha256.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from typing import Any

IMAGE_PIXELS_PER_TOKEN = 750
IMAGE_MAX_TOKENS = 1600  # an image scaled to the API's limit (about 1.15 megapixels)
PDF_PAGE_TEXT_TOKENS = 2250  # documented: 1,500-3,000 per page by text density
PDF_PAGE_TOKENS = PDF_PAGE_TEXT_TOKENS + IMAGE_MAX_TOKENS
HEADER_B64_CHARS = 87384  # the first 64 KiB of a file: where a JPEG's frame header sits
_CACHE_MAX = 4096
_BY_SHA: dict[str, int] = {}  # a stored block's estimate, by its sha256


def image_dims(head: bytes) -> tuple[int, int] | None:
    """(width, height) from the first bytes of a PNG, JPEG, GIF or WebP, or None."""
    try:
        if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR":
            w, h = struct.unpack(">II", head[16:24])
            return (w, h) if w and h else None
        if head[:6] in (b"GIF87a", b"GIF89a"):
            w, h = struct.unpack("<HH", head[6:10])
            return (w, h) if w and h else None
        if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
            return _webp(head)
        if head.startswith(b"\xff\xd8"):
            return _jpeg(head)
    except struct.error:  # a header cut short
        return None
    return None


def _webp(head: bytes) -> tuple[int, int] | None:
    chunk = head[12:16]
    if chunk == b"VP8 ":
        w, h = struct.unpack("<HH", head[26:30])
        return (w & 0x3FFF, h & 0x3FFF) if w & 0x3FFF and h & 0x3FFF else None
    if chunk == b"VP8L":
        (bits,) = struct.unpack("<I", head[21:25])
        return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    if chunk == b"VP8X":
        w = int.from_bytes(head[24:27], "little") + 1
        h = int.from_bytes(head[27:30], "little") + 1
        return w, h
    return None


def _jpeg(head: bytes) -> tuple[int, int] | None:
    """The frame header's size (SOF0-SOF15 but DHT, JPG and DAC), walking the segments."""
    i = 2
    while i + 9 <= len(head):
        if head[i] != 0xFF:
            return None
        marker = head[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if 0xD0 <= marker <= 0xD9 or marker == 0x01:  # no length
            i += 2
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            h, w = struct.unpack(">HH", head[i + 5 : i + 9])
            return (w, h) if w and h else None
        (length,) = struct.unpack(">H", head[i + 2 : i + 4])
        i += 2 + length
    return None


def image_tokens(width: int, height: int) -> int:
    return max(1, min(IMAGE_MAX_TOKENS, math.ceil(width * height / IMAGE_PIXELS_PER_TOKEN)))


def pdf_pages(data: bytes) -> int:
    """Page objects in the file's uncompressed text (as the SQL check counts them)."""
    n = 0
    for p in (b"/Type /Page", b"/Type/Page"):
        n += data.count(p) - data.count(p + b"s")
    return n


def _decode(b64: str, chars: int | None = None) -> bytes:
    part = b64 if chars is None else b64[: chars - chars % 4]
    try:
        return base64.b64decode(part)
    except (binascii.Error, ValueError):
        return b""


def _of_data(kind: str, media_type: str, b64: str) -> int:
    if kind == "image":
        dims = image_dims(_decode(b64, HEADER_B64_CHARS))
        return image_tokens(*dims) if dims else IMAGE_MAX_TOKENS
    if media_type == "application/pdf":
        return max(1, pdf_pages(_decode(b64))) * PDF_PAGE_TOKENS
    return 0


def block_tokens(block: dict[str, Any], sent: dict[str, Any] | None = None) -> int | None:
    """The tokens of an image or document block (`block` as stored, `sent` with its
    bytes when it is stored by reference); None for any other block, and for a
    document whose text is counted as text (a plain-text or custom-content source)."""
    kind = block.get("type")
    if kind not in ("image", "document"):
        return None
    source = block.get("source")
    if not isinstance(source, dict):
        return IMAGE_MAX_TOKENS if kind == "image" else PDF_PAGE_TOKENS
    if kind == "document" and source.get("type") in ("text", "content"):
        return None
    ref = source.get("hango_blob")
    if isinstance(ref, str) and ref in _BY_SHA:
        return _BY_SHA[ref]
    wire = (sent or {}).get("source") if isinstance(ref, str) else source
    data = wire.get("data") if isinstance(wire, dict) else None
    if source.get("type") != "base64" or not isinstance(data, str):
        return IMAGE_MAX_TOKENS if kind == "image" else PDF_PAGE_TOKENS  # URL, file
    n = _of_data(str(kind), str(source.get("media_type", "")), data)
    if isinstance(ref, str):
        if len(_BY_SHA) >= _CACHE_MAX:
            _BY_SHA.clear()
        _BY_SHA[ref] = n
    return n
