"""The fake's Files API: ``POST /v1/files`` (multipart upload), ``GET /v1/files/{id}``
(metadata), ``DELETE /v1/files/{id}``, and ``file`` sources in messages resolved to the
uploaded bytes (checked by media.py as inline ones are). `FakeFiles.forget(id)` drops a
file as if the API no longer had it: a message naming it gets the API's 404
``not_found_error``. `uploads` counts the uploads served."""

from __future__ import annotations

import base64
import itertools
from dataclasses import dataclass
from datetime import UTC, datetime
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from hango_worker.testing.fake_anthropic.validate import ApiError

FILES_PATH = "/v1/files"
MAX_FILE_BYTES = 500 * 1024 * 1024  # the Files API's documented limit per file


@dataclass(slots=True)
class FakeFile:
    id: str
    filename: str
    mime_type: str
    data: bytes
    created_at: str

    def metadata(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "file",
            "filename": self.filename,
            "mime_type": self.mime_type,
            "size_bytes": len(self.data),
            "created_at": self.created_at,
            "downloadable": False,
        }


def _multipart_file(content_type: str, body: bytes) -> tuple[str, str, bytes]:
    """(filename, media type, bytes) of the `file` part of a multipart/form-data body."""
    raw = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1") + body
    msg = BytesParser(policy=HTTP).parsebytes(raw)
    if not msg.is_multipart():
        raise ApiError(400, "invalid_request_error", "file: the body is not multipart/form-data")
    for part in msg.iter_parts():
        if part.get_param("name", header="content-disposition") == "file":
            data = part.get_payload(decode=True)
            name = part.get_filename() or "unnamed"
            media = part.get_content_type()
            return name, media, data if isinstance(data, bytes) else b""
    raise ApiError(400, "invalid_request_error", "file: Field required")


class FakeFiles:
    """The files uploaded to one fake server, by id."""

    def __init__(self) -> None:
        self.files: dict[str, FakeFile] = {}
        self.uploads = 0  # upload requests served
        self._ids = itertools.count(1)

    def forget(self, file_id: str) -> None:
        """Drop a file, as if the API no longer had it (expired, deleted elsewhere)."""
        self.files.pop(file_id, None)

    def serve(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
        """The JSON answer to a Files API request; ApiError for what the API refuses."""
        if path == FILES_PATH and method == "POST":
            return self._upload(headers.get("content-type", ""), body)
        file_id = path[len(FILES_PATH) + 1 :]
        if path.startswith(FILES_PATH + "/") and "/" not in file_id:
            found = self.files.get(file_id)
            if found is None:
                raise ApiError(404, "not_found_error", f"File not found: {file_id}")
            if method == "GET":
                return found.metadata()
            if method == "DELETE":
                del self.files[file_id]
                return {"id": file_id, "type": "file_deleted"}
        raise ApiError(404, "not_found_error", f"Not found: {method} {path}")

    def _upload(self, content_type: str, body: bytes) -> dict[str, Any]:
        if not content_type.startswith("multipart/form-data"):
            raise ApiError(400, "invalid_request_error", "the upload must be multipart/form-data")
        name, media, data = _multipart_file(content_type, body)
        if not data:
            raise ApiError(400, "invalid_request_error", "file: the file is empty")
        if len(data) > MAX_FILE_BYTES:
            raise ApiError(413, "request_too_large", "file: the file exceeds 500 MB")
        self.uploads += 1
        now = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        f = FakeFile(f"file_fake_{next(self._ids):06d}", name, media, data, now)
        self.files[f.id] = f
        return f.metadata()

    def resolve(self, path: str, source: dict[str, Any]) -> dict[str, Any]:
        """A `file` source as the base64 source of its bytes (404 for a file not here)."""
        file_id = source.get("file_id")
        found = self.files.get(file_id) if isinstance(file_id, str) else None
        if found is None:
            raise ApiError(404, "not_found_error", f"{path}.source: File not found: {file_id}")
        data = base64.b64encode(found.data).decode("ascii")
        return {"type": "base64", "media_type": found.mime_type, "data": data}
