"""Fleet-wide model rate limits (rate_limits): set, list, remove the buckets that every
worker's model calls take from (run/ratelimit.py; docs/operations.md "Tenants,
fairness and limits"). A change takes effect at the next model call of every worker."""

from __future__ import annotations

from typing import Any

import asyncpg

from hango_worker.store.repo import NotFound

MAX_PER_MINUTE = 1_000_000_000


def check_limit(what: str, n: int | None) -> None:
    if n is None:
        return
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PER_MINUTE:
        raise ValueError(f"{what} must be a whole number 1 to {MAX_PER_MINUTE}, got {n!r}")


def check_key(key: str) -> None:
    if not isinstance(key, str) or not key.strip() or len(key) > 200:
        raise ValueError("a rate limit key must be 1 to 200 characters (e.g. 'anthropic')")


async def set_rate_limit(
    db: asyncpg.Pool | asyncpg.Connection,
    key: str,
    *,
    requests_per_minute: int | None = None,
    input_tokens_per_minute: int | None = None,
    output_tokens_per_minute: int | None = None,
    window_s: float = 60.0,
) -> dict[str, Any]:
    """Create or replace a key's limits (None: that dimension unlimited). A new bucket
    starts full; a changed one keeps its level, cut to the new size."""
    check_key(key)
    check_limit("requests_per_minute", requests_per_minute)
    check_limit("input_tokens_per_minute", input_tokens_per_minute)
    check_limit("output_tokens_per_minute", output_tokens_per_minute)
    if not 0.001 <= window_s <= 3600:
        raise ValueError(f"window_s must be 0.001 to 3600 seconds, got {window_s!r}")
    if (requests_per_minute, input_tokens_per_minute, output_tokens_per_minute) == (None,) * 3:
        raise ValueError("give at least one limit (requests or input/output tokens per minute)")
    if requests_per_minute is not None and requests_per_minute * window_s / 60.0 < 1:
        raise ValueError(
            f"a bucket of {requests_per_minute} requests per minute over {window_s:g} s holds "
            f"less than one request and would never grant a call: give window_s of at least "
            f"{60.0 / requests_per_minute:g} s"
        )
    for what, tpm in (
        ("input_tokens_per_minute", input_tokens_per_minute),
        ("output_tokens_per_minute", output_tokens_per_minute),
    ):
        if tpm is not None and tpm * window_s / 60.0 < 1:
            raise ValueError(
                f"a bucket of {what} {tpm} over {window_s:g} s holds less than one token: "
                f"give window_s of at least {60.0 / tpm:g} s"
            )
    row = await db.fetchrow(
        """
        INSERT INTO rate_limits AS l (key, requests_per_minute, input_tokens_per_minute,
            output_tokens_per_minute, window_s, requests, input_tokens, output_tokens)
        VALUES ($1, $2::int, $3::int, $4::int, $5::float8, coalesce($2, 0) * $5 / 60.0,
            coalesce($3, 0) * $5 / 60.0, coalesce($4, 0) * $5 / 60.0)
        ON CONFLICT (key) DO UPDATE SET requests_per_minute = $2, input_tokens_per_minute = $3,
            output_tokens_per_minute = $4, window_s = $5,
            requests = least(l.requests, coalesce($2, 0) * $5 / 60.0),
            input_tokens = least(l.input_tokens, coalesce($3, 0) * $5 / 60.0),
            output_tokens = least(l.output_tokens, coalesce($4, 0) * $5 / 60.0),
            updated_at = now()
        RETURNING key, requests_per_minute, input_tokens_per_minute, output_tokens_per_minute,
            window_s
        """,
        key,
        requests_per_minute,
        input_tokens_per_minute,
        output_tokens_per_minute,
        float(window_s),
    )
    assert row is not None
    return dict(row)


async def list_rate_limits(db: asyncpg.Pool | asyncpg.Connection) -> list[dict[str, Any]]:
    rows = await db.fetch(
        "SELECT key, requests_per_minute, input_tokens_per_minute, output_tokens_per_minute, "
        "window_s, requests, input_tokens, output_tokens, refilled_at, blocked_until "
        "FROM rate_limits ORDER BY key"
    )
    return [dict(r) for r in rows]


async def remove_rate_limit(db: asyncpg.Pool | asyncpg.Connection, key: str) -> None:
    if await db.fetchval("DELETE FROM rate_limits WHERE key = $1 RETURNING 1", key) is None:
        raise NotFound(f"no rate limit {key!r} (`hango-worker ratelimits list` lists them)")
