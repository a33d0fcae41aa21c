"""The producer SQL API from Python: the statements that call it, and its error codes.

Enqueue, cancel and resume are implemented once, in SQL (migration 0009_producer_api,
docs/producers.md): `hango_api.enqueue` for producers in any language, and the Python
client and CLI through `store/repo.py`, which call the same function
(`hango_enqueue_run`, which `hango_api.enqueue` wraps, also returns the session and
whether the call created the run). An API error carries a SQLSTATE of class QH; `raise_as`
turns it into the exception the Python callers have always raised.
"""

from __future__ import annotations

# The API's names in the database (migration 0009_producer_api): not metrics.
SQL_NAMES = frozenset(
    {"hango_api", "hango_producer", "hango_enqueue_run", "hango_run_input", "hango_tenant_id"}
)
# content blocks as input, stored once (migration 0016_content_blobs)
SQL_NAMES = SQL_NAMES | frozenset(
    {"hango_run_input_text", "hango_check_content", "hango_store_blobs", "hango_ref_blobs"}
    | {"hango_sniff", "hango_pdf_pages"}
)

UNKNOWN_TENANT = "QH001"
UNKNOWN_AGENT = "QH002"
MALFORMED = "QH003"
UNKNOWN_SESSION = "QH004"
UNKNOWN_RUN = "QH005"
WRONG_STATE = "QH006"

# $3 and $6 are JSON text (no codecs needed on the caller's own connection); $7 the
# priority (0010_tenants)
ENQUEUE = (
    "SELECT run_id::text, session_id::text, created FROM hango_enqueue_run("
    "$1::text, $2::text, $3::text::jsonb, $4::text::uuid, $5::text, $6::text::jsonb, $7::int)"
)
CANCEL = "SELECT hango_api.cancel($1::text::uuid, $2::text)"
RESUME = "SELECT hango_api.resume($1::text::uuid, $2::text)"


class ApiError(Exception):
    """A producer API error: its SQLSTATE and Postgres's message."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message


def api_error(e: Exception) -> ApiError | None:
    """The API error `e` is (a QH SQLSTATE), or None for any other database error."""
    code = getattr(e, "sqlstate", None)
    if isinstance(code, str) and code.startswith("QH"):
        return ApiError(code, str(getattr(e, "message", None) or e))
    return None
