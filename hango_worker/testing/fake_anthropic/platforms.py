"""The platforms' routes of the fake: Vertex AI and the Bedrock runtime.

Vertex AI: ``POST [/v1]/projects/{project}/locations/{region}/publishers/anthropic/
models/{model}:rawPredict`` and ``:streamRawPredict`` (SSE, as the Messages API);
Bedrock: ``POST /model/{id}/invoke`` and ``/model/{id}/invoke-with-response-stream``,
whose stream is in AWS event-stream framing: each SSE event's JSON, base64, in the
``bytes`` of a ``chunk`` event (what botocore's `EventStreamBuffer` and
`EventStreamJSONParser` read, as the SDK's `AWSEventStreamDecoder` does), and an
``error`` event as an ``error`` message whose ``:error-code`` is its type (e.g.
``overloaded_error``) and ``:error-message`` its message.

The body is the Messages API's without ``model`` (it is in the path), with
``anthropic_version`` (required: else the 400 the API gives a missing version) and,
on Bedrock, ``anthropic_beta`` (a list) for the ``anthropic-beta`` header. A request
must carry credentials: ``Authorization: Bearer`` (a Vertex access token, a Bedrock
API key) or, on Bedrock, an AWS SigV4 signature (``AWS4-HMAC-SHA256 ...``); any
value is accepted, as the fake checks no signature. After that the request is served
as a Messages API request (`RecordedRequest.platform` names the platform).
"""

from __future__ import annotations

import base64
import json
import re
import struct
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from hango_worker.testing.fake_anthropic.sse import GARBAGE, Frame
from hango_worker.testing.fake_anthropic.validate import ApiError

if TYPE_CHECKING:
    from hango_worker.testing.fake_anthropic.script import RecordedRequest

VERTEX_ROUTE = re.compile(
    r"^(?:/v1)?/projects/(?P<project>[^/]+)/locations/(?P<region>[^/]+)"
    r"/publishers/anthropic/models/(?P<model>[^/]+):(?P<verb>rawPredict|streamRawPredict)$"
)
BEDROCK_ROUTE = re.compile(
    r"^/model/(?P<model>[^/]+)/(?P<verb>invoke|invoke-with-response-stream)$"
)
EVENT_STREAM_TYPE = "application/vnd.amazon.eventstream"
_STRING = 7  # the event-stream header value type of a string


@dataclass(frozen=True, slots=True)
class Route:
    platform: str  # "vertex" | "bedrock"
    model: str
    stream: bool


def match_route(method: str, path: str) -> Route | None:
    """The platform route `path` is, if it is one."""
    if method != "POST":
        return None
    if m := VERTEX_ROUTE.match(path):
        model = unquote(m["model"])
        return Route("vertex", model, m["verb"] == "streamRawPredict")
    if m := BEDROCK_ROUTE.match(path):
        model = unquote(m["model"])
        return Route("bedrock", model, m["verb"] == "invoke-with-response-stream")
    return None


def as_messages_request(route: Route, rec: RecordedRequest) -> None:
    """Turn a platform request into the Messages API request it stands for (in place)."""
    auth = rec.headers.get("authorization", "")
    signed = route.platform == "bedrock" and auth.startswith("AWS4-HMAC-SHA256 Credential=")
    if not signed and not (auth[:7].lower() == "bearer " and auth[7:].strip()):
        raise ApiError(401, "authentication_error", f"{route.platform}: no credentials")
    body = rec.body
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_request_error", "the body must be a JSON object")
    if "model" in body:
        raise ApiError(400, "invalid_request_error", "model: Extra inputs are not permitted")
    version = body.pop("anthropic_version", None)
    if not isinstance(version, str):
        raise ApiError(400, "invalid_request_error", "anthropic_version: Field required")
    rec.headers["anthropic-version"] = version
    betas = body.pop("anthropic_beta", None)
    if isinstance(betas, list) and route.platform == "bedrock":
        rec.headers["anthropic-beta"] = ",".join(str(b) for b in betas)
    if route.platform == "vertex" and bool(body.get("stream")) != route.stream:
        raise ApiError(400, "invalid_request_error", "stream does not match the method")
    if route.platform == "bedrock":
        if "stream" in body:
            raise ApiError(400, "invalid_request_error", "stream: Extra inputs are not permitted")
        if route.stream:
            body["stream"] = True
    body["model"] = route.model
    rec.platform = route.platform


def event_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One AWS event-stream message: prelude (lengths, CRC), headers, payload, CRC."""
    head = b""
    for name, value in headers.items():
        raw_name, raw_value = name.encode(), value.encode()
        head += struct.pack("!B", len(raw_name)) + raw_name
        head += struct.pack("!BH", _STRING, len(raw_value)) + raw_value
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack("!II", total, len(head))
    prelude += struct.pack("!I", zlib.crc32(prelude))
    message = prelude + head + payload
    return message + struct.pack("!I", zlib.crc32(message))


def bedrock_frame(frame: Frame) -> bytes:
    """An SSE frame as Bedrock streams it: a `chunk` event, or an `exception`."""
    kind, data = frame
    if kind == "error":
        err: dict[str, Any] = data.get("error") or {}
        headers = {
            ":message-type": "error",
            ":error-code": str(err.get("type", "api_error")),
            ":error-message": str(err.get("message", "")),
        }
        return event_message(headers, b"")
    garbage = data.get(GARBAGE) if kind == "content_block_delta" else None
    raw = garbage.encode() if isinstance(garbage, str) else json.dumps(data).encode()
    payload = json.dumps({"bytes": base64.b64encode(raw).decode(), "p": "abcd"}).encode()
    headers = {
        ":event-type": "chunk",
        ":content-type": "application/json",
        ":message-type": "event",
    }
    return event_message(headers, payload)
