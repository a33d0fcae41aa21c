"""Images and documents in a request, checked as the API checks them (400
invalid_request_error): the media types the SDK's types allow, valid base64, bytes that
are what the media type says, at most 5 MB of base64 per image, 100 images per request,
100 pages per PDF (docs/inputs-and-outputs.md, "Limits"). In user messages and in
tool results' content; a Files API `file` source as the bytes uploaded (files.py)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from typing import Any

from hango_worker.provider.content import media_types, sniff
from hango_worker.provider.files import FILES_BETA
from hango_worker.testing.fake_anthropic.files import FakeFiles
from hango_worker.testing.fake_anthropic.validate import ApiError, content_blocks

MAX_IMAGE_B64 = 5 * 1024 * 1024
MAX_IMAGES = 100
MAX_PDF_PAGES = 100


def _bad(path: str, message: str) -> ApiError:
    return ApiError(400, "invalid_request_error", f"{path}: {message}")


def pdf_pages(data: bytes) -> int:
    """Page objects in the file's uncompressed text (as hango_pdf_pages counts them)."""
    n = 0
    for p in (b"/Type /Page", b"/Type/Page"):
        n += data.count(p) - data.count(p + b"s")
    return n


def _blocks(messages: list[Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for i, m in enumerate(messages):
        for j, b in enumerate(content_blocks(m)):
            yield f"messages.{i}.content.{j}", b
            inner = b.get("content") if b.get("type") == "tool_result" else None
            if isinstance(inner, list):
                for k, c in enumerate(inner):
                    if isinstance(c, dict):
                        yield f"messages.{i}.content.{j}.content.{k}", c


def _check_source(path: str, kind: str, source: dict[str, Any]) -> None:
    allowed = media_types(kind)
    media_type = source.get("media_type")
    if media_type not in allowed:
        expected = " or ".join(repr(t) for t in allowed)
        raise _bad(f"{path}.source.base64.media_type", f"Input should be {expected}")
    data = source.get("data")
    try:
        raw = base64.b64decode(data if isinstance(data, str) else "", validate=True)
    except (binascii.Error, ValueError):
        raise _bad(f"{path}.source.base64.data", "invalid base64 data") from None
    if not raw:
        raise _bad(f"{path}.source.base64.data", "the data is empty")
    if kind == "image" and len(data or "") > MAX_IMAGE_B64:
        raise _bad(
            f"{path}.image.source.base64",
            f"image exceeds 5 MB maximum: {len(data or '')} bytes > {MAX_IMAGE_B64} bytes",
        )
    if sniff(raw) != media_type:
        raise _bad(
            f"{path}.source.base64.data",
            f"The {kind} was specified using the {media_type} media type, but the data does "
            "not appear to be one",
        )
    if media_type == "application/pdf" and pdf_pages(raw) > MAX_PDF_PAGES:
        raise _bad(
            f"{path}.document.source.base64.data",
            f"A maximum of {MAX_PDF_PAGES} PDF pages may be provided.",
        )


def check_media(messages: list[Any], files: FakeFiles | None = None) -> None:
    """ApiError for the first image or document the API would refuse. A `file` source
    is checked as its uploaded bytes (`files`: None when the request lacks the Files
    API beta, which such a source needs)."""
    images = 0
    for path, b in _blocks(messages):
        kind = b.get("type")
        if kind not in ("image", "document"):
            continue
        images += kind == "image"
        source = b.get("source")
        if not isinstance(source, dict):
            raise _bad(f"{path}.source", "Field required")
        if source.get("type") == "file":
            if files is None:
                raise _bad(
                    f"{path}.source",
                    f"a file source needs the anthropic-beta header {FILES_BETA}",
                )
            source = files.resolve(path, source)
        if source.get("type") == "base64":
            _check_source(path, str(kind), source)
        elif kind == "image" and source.get("type") not in ("url", "file"):
            raise _bad(f"{path}.source.type", "Input should be 'base64', 'url' or 'file'")
    if images > MAX_IMAGES:
        raise ApiError(
            400,
            "invalid_request_error",
            f"messages: A maximum of {MAX_IMAGES} images may be provided in a request; "
            f"found {images}.",
        )
