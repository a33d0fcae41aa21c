"""Minimal HTTP/1.1 over asyncio streams: reading requests, writing responses."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


async def read_request(reader: asyncio.StreamReader) -> HttpRequest | None:
    line = await reader.readline()
    if not line.strip():
        return None
    method, target, _version = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    else:
        length = int(headers.get("content-length") or 0)
        body = await reader.readexactly(length) if length else b""
    return HttpRequest(method.upper(), target.split("?", 1)[0], headers, body)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            await reader.readline()
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readline()


def response_head(status: int, headers: dict[str, str]) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Overloaded" if status == 529 else "Error"
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def json_response(status: int, body: Any, headers: dict[str, str]) -> bytes:
    data = json.dumps(body).encode()
    head = {"content-type": "application/json", "content-length": str(len(data)), **headers}
    return response_head(status, head) + data
