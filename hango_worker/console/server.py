"""`hango-worker console`: the console's own process, uvicorn serving `app.py`.

Off unless started, and it refuses to start without a way to authenticate anyone
(`HANGO_CONSOLE_TOKENS` or `HANGO_CONSOLE_PROXY_HEADER` with its users). It listens
on `HANGO_CONSOLE_HOST` (127.0.0.1 unless configured) and `HANGO_CONSOLE_PORT`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import uvicorn

from hango_worker.config import ConfigError, Settings
from hango_worker.console.app import build_app
from hango_worker.console.protocol import IDLE_TIMEOUT_S, HeadTimeoutProtocol
from hango_worker.store import db

log = logging.getLogger(__name__)


def check(settings: Settings) -> None:
    """ConfigError when nobody could sign in (the console would only say 401)."""
    if not settings.console_tokens and not settings.console_proxy_header:
        raise ConfigError(
            "configuration error: the console needs credentials: set HANGO_CONSOLE_TOKENS "
            '(JSON {"<token>": {"role": "read"|"act"}}) or HANGO_CONSOLE_PROXY_HEADER with '
            "HANGO_CONSOLE_PROXY_USERS (docs/operations.md, the run console)"
        )
    if settings.console_proxy_header and not settings.console_proxy_users:
        raise ConfigError(
            "configuration error: HANGO_CONSOLE_PROXY_HEADER is set but "
            "HANGO_CONSOLE_PROXY_USERS names nobody: set the users and their roles"
        )


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ConfigError(
            f"configuration error: the console cannot listen on {host}:{port} "
            f"({e.strerror or e}): set HANGO_CONSOLE_PORT to a free port or stop what holds it"
        ) from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


@dataclass
class Running:
    url: str
    server: uvicorn.Server
    task: asyncio.Task[None]


@contextlib.asynccontextmanager
async def running(settings: Settings, dsn: str) -> AsyncIterator[Running]:
    """The console serving in this event loop until the block ends."""
    check(settings)
    await db.require_migrated(dsn)
    sock = bind(settings.console_host, settings.console_port)
    pool = await db.open_pool(dsn, min_size=1, max_size=8)
    app, console = build_app(settings, pool, dsn)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=2,
        http=HeadTimeoutProtocol,  # a request head must come within its timeout
        timeout_keep_alive=int(IDLE_TIMEOUT_S),
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="hango-console")
    try:
        while not server.started and not task.done():  # noqa: ASYNC110 (uvicorn: a flag)
            await asyncio.sleep(0.01)
        if task.done():
            task.result()  # uvicorn's own start-up error
        host, port = sock.getsockname()[:2]
        host = f"[{host}]" if ":" in host else host
        yield Running(f"http://{host}:{port}", server, task)
    finally:
        console.hub.closing = True
        server.should_exit = True
        with contextlib.suppress(Exception):
            await task
        await console.hub.close()
        await pool.close()
        sock.close()


async def serve(settings: Settings, dsn: str) -> None:
    """Serve until SIGTERM / SIGINT (uvicorn's own handlers end the server)."""
    async with running(settings, dsn) as r:
        log.info("console on %s", r.url)
        print(f"hango-worker console on {r.url}", flush=True)
        await r.task
