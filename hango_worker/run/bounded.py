"""Bounded waits for the shutdown path: nothing a stopping worker awaits may wait forever.

Observed: on a loaded machine the suite once hung in tests/test_ratelimit_procs.py, whose
`hango-worker run --until-idle` processes, SIGTERMed, did not all exit (and the test
waited for them without a bound). Every await on that path could wait forever: the
claim in flight, a cancelled run task's statement (asyncpg waits for the server to
acknowledge the cancel), the pool's close (it waits for every connection to come back),
the last live-text flush, and the interpreter's exit itself (a sync tool's thread, which
`ThreadPoolExecutor` joins). Each is bounded now: here, in run/worker.py (`_drain`,
`_close`), service.py (`_close_all`, the exit watchdog) and tool/threads.py (daemon
threads); tests/test_shutdown.py and tests/test_shutdown_procs.py pin each one.

`asyncio.wait_for` is not a bound there: on timeout it cancels the awaitable and then
waits for the cancellation to finish, and an asyncpg statement on a connection that
stopped answering (or a pool's close, which waits for every connection to come back)
can take forever to finish cancelling. `within` waits at most its seconds, then cancels
and walks away; `close_pool` closes a pool within its seconds, else terminates its
connections (docs/system-architecture.md, "Graceful shutdown").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

import asyncpg

log = logging.getLogger(__name__)


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def within(aw: Awaitable[Any], seconds: float, what: str) -> bool:
    """Await `aw` for at most `seconds`; whether it finished (an error it raised is
    logged, never raised). Unfinished, it is cancelled and left to unwind on its own."""
    task = asyncio.ensure_future(aw)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        task.add_done_callback(_consume)
        log.warning("shutdown: %s did not finish within %gs; abandoned", what, seconds)
        return False
    if not task.cancelled() and (e := task.exception()) is not None:
        log.warning("shutdown: %s failed: %s", what, e)
    return True


async def close_pool(pool: asyncpg.Pool, seconds: float, what: str = "closing a pool") -> None:
    """Close `pool` gracefully within `seconds`, else terminate its connections (a
    connection still held by a stuck statement would keep `close()` waiting forever)."""
    if not await within(pool.close(), seconds, what):
        pool.terminate()
