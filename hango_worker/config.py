"""Configuration from the environment (HANGO_*), validated at start-up.

A bad value stops start-up with one line naming the variable, the value and
what is allowed (`ConfigError`), never a traceback.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import socket
import uuid
from collections.abc import MutableMapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError


class ConfigError(ValueError):
    pass


HEADER = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,99}")
MIN_TOKEN = 32  # characters of a console token
HOSTNAME = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9-]{1,63})*")


class ModelPriceSetting(BaseModel):
    """One model's prices in HANGO_MODEL_PRICES, USD per million tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_write_5m: float = Field(ge=0)
    cache_write_1h: float = Field(ge=0)
    cache_read: float = Field(ge=0)
    # laid over the defaults of provider/prices.py: USD per server-tool unit, and the
    # multipliers of the tiers, speeds and geographies the API reports in usage
    server_tool_use: dict[str, Annotated[float, Field(ge=0)]] | None = None
    service_tier: dict[str, Annotated[float, Field(ge=0)]] | None = None
    speed: dict[str, Annotated[float, Field(ge=0)]] | None = None
    inference_geo: dict[str, Annotated[float, Field(ge=0)]] | None = None


class ConsoleGrant(BaseModel):
    """What one console credential (a token, or a user named by the trusted proxy) may do:
    `read` (pages, live text) or `act` (read, and approve / reject / answer), in the
    tenants listed (tenant ids; empty: the default tenant)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    role: Literal["read", "act"]
    tenants: tuple[uuid.UUID, ...] = ()
    name: str = Field(default="", max_length=100, pattern=r"^[A-Za-z0-9._@-]*$")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HANGO_", extra="ignore", frozen=True)

    database_url: str | None = Field(
        default=None, description="postgresql:// URL; unset → embedded Postgres in data_dir"
    )
    data_dir: Path = Field(default=Path(".hango"), description="embedded Postgres data folder")
    worker_concurrency: int = Field(default=8, ge=1, le=1000, description="runs at once")
    poll_interval_s: float = Field(default=2.0, gt=0, le=3600, description="queue poll fallback")
    max_turns: int = Field(default=50, ge=1, le=10_000, description="model turns per run")
    model_provider: Literal["scripted", "anthropic", "auto"] = Field(
        default="auto", description="scripted | anthropic | auto"
    )
    script: Path | None = Field(default=None, description="scripted model's script (JSON)")
    repeat_call_threshold: int = Field(default=3, ge=2, le=1000)
    lease_s: float = Field(default=30.0, ge=1, le=3600, description="run lease length")
    max_attempts: int = Field(default=5, ge=1, le=100)
    # how often a worker tries a retention pass (store/retention.py; one worker at a time
    # runs it, the others skip); 0 disables enforcement on this worker
    retention_interval_s: float = Field(
        default=300.0, ge=0, le=86_400, description="retention pass interval (0: off)"
    )
    # Derived from the default tool timeout (tool/types.py DEFAULT_TOOL_TIMEOUT_S, 60 s)
    # plus 5 s: a deploy lets a tool call in flight finish and checkpoint before the runs
    # are handed back (docs/operations.md, "Crashes, deploys and what happens to runs").
    shutdown_grace_s: float = Field(default=65.0, ge=0, le=3600)
    schema_check_interval_s: float = Field(
        default=60.0, gt=0, le=3600, description="how often a worker checks the schema serves it"
    )
    metrics_port: int = Field(default=9464, ge=0, le=65535, description="0 = ephemeral")
    metrics_host: str = Field(
        default="0.0.0.0", description="address /metrics /healthz /readyz listen on"
    )
    capture_content: bool = False
    anthropic_max_retries: int = Field(default=2, ge=0, le=10)
    # where Claude runs unless an agent says otherwise (provider/platforms.py)
    platform: Literal["anthropic", "bedrock", "vertex"] = Field(
        default="anthropic", description="anthropic | bedrock | vertex"
    )
    platform_region: str = Field(default="", max_length=64, description="Bedrock/Vertex region")
    vertex_project: str = Field(default="", max_length=128, description="Vertex AI project id")
    model_retries: int = Field(default=4, ge=0, le=20, description="our retries of a model call")
    worker_id: str = Field(default="", description="defaults to host-pid-random")
    rate_limit_key: str = Field(
        default="",
        max_length=200,
        description="the rate_limits bucket every model call takes from ('' = none); "
        "{model} is replaced by the request's model",
    )
    tool_modules: str = Field(
        default="", description="extra tools: comma-separated module:attribute (Tool or list)"
    )
    model_prices: dict[str, ModelPriceSetting] = Field(
        default_factory=dict,
        description='JSON {"<model>": {"input": 3, "output": 15, "cache_write_5m": 3.75, '
        '"cache_write_1h": 6, "cache_read": 0.3}} in USD per million tokens',
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] = "json"
    # `hango-worker console` (docs/operations.md, the run console)
    console_host: str = Field(default="127.0.0.1", description="address the console listens on")
    console_port: int = Field(default=9470, ge=0, le=65535, description="0 = ephemeral")
    console_tokens: dict[str, ConsoleGrant] = Field(
        default_factory=dict,
        description='JSON {"<token of 32+ characters>": {"role": "read"|"act", '
        '"tenants": ["<tenant id>", …]}}',
    )
    console_proxy_header: str = Field(
        default="", description="header a trusted proxy sets to the signed-in user's name"
    )
    console_proxy_users: dict[str, ConsoleGrant] = Field(
        default_factory=dict,
        description='JSON {"<user>": {"role": "read"|"act", "tenants": [...]}}',
    )
    console_trace_url: str = Field(
        default="", description="link to a run's trace: a URL with {run_id} in it"
    )

    @field_validator("database_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        asyncpg_dsn(v)  # the parameters too (sslmode, sslrootcert, …), before anything connects
        return v

    @field_validator("console_tokens")
    @classmethod
    def _tokens(cls, v: dict[str, ConsoleGrant]) -> dict[str, ConsoleGrant]:
        for token in v:
            if len(token) < MIN_TOKEN or not token.isascii() or not token.isprintable():
                raise ValueError(f"each token must be {MIN_TOKEN}+ printable ASCII characters")
        return v

    @field_validator("console_proxy_header")
    @classmethod
    def _header(cls, v: str) -> str:
        if v and not HEADER.fullmatch(v):
            raise ValueError("must be an HTTP header name (letters, digits, -)")
        return v.lower()

    @field_validator("console_trace_url")
    @classmethod
    def _trace_url(cls, v: str) -> str:
        if v and (not v.startswith(("http://", "https://")) or "{run_id}" not in v):
            raise ValueError("must be an http(s) URL containing {run_id}")
        return v

    @field_validator("metrics_host", "console_host")
    @classmethod
    def _host(cls, v: str) -> str:
        with contextlib.suppress(ValueError):
            return str(ipaddress.ip_address(v))
        if not HOSTNAME.fullmatch(v):
            raise ValueError("must be an IP address (e.g. 127.0.0.1, ::) or a host name")
        return v

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v

    def effective_worker_id(self) -> str:
        return self.worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


# Database URLs as users write them (libpq style). `asyncpg_dsn` serves every path that
# connects: the worker's pool and one-off connections (store/db.py), `hango-worker migrate`
# (alembic/env.py hands SQLAlchemy a connection asyncpg opened from this DSN, because
# SQLAlchemy passes query parameters such as `sslmode` to asyncpg as keyword arguments it
# does not take) and the validation of HANGO_DATABASE_URL above, so a bad parameter is a
# configuration error (one line, exit 2). docs/operations.md "Database URLs".
DB_SCHEMES = ("postgresql://", "postgres://", "postgresql+asyncpg://")
DB_URL_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "target_session_attrs": (
        *("any", "primary", "standby", "prefer-standby", "read-write", "read-only"),
    ),
}
DB_URL_FILES = ("sslrootcert", "sslcert", "sslkey")


def asyncpg_dsn(url: str) -> str:
    """`url` as asyncpg.connect takes it (postgresql://…, the query kept as written),
    or ValueError with one line saying what is wrong (never the password)."""
    scheme = next((s for s in DB_SCHEMES if url.startswith(s)), None)
    if scheme is None:
        raise ValueError("must start with postgresql://")
    dsn = "postgresql://" + url[len(scheme) :]
    try:  # read as the driver reads it: host (IPv6 in brackets) and port
        parts = urlsplit(dsn)
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError as e:
        raise ValueError(f"is not a URL ({e}), e.g. postgresql://user@[::1]:5432/db") from None
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        allowed = DB_URL_CHOICES.get(name)
        if allowed is not None and value not in allowed:
            raise ValueError(f"{name}={value!r} is not one of {', '.join(allowed)}")
        if name in DB_URL_FILES and not os.path.isfile(value):
            raise ValueError(f"{name}={value!r}: no such file")
    return dsn


def _without_password(url: str) -> str:
    """`url` with the password of its user:password@ part masked, for messages."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in creds:
        return url
    return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"


def _describe(field: str, err: dict[str, Any]) -> str:
    name = f"HANGO_{field.upper()}"
    inner = [str(part) for part in err.get("loc", ())[1:]]
    if inner:  # a JSON setting: name the part that is wrong
        name += f" [{'.'.join(inner)}]"
    value = err.get("input")
    if field == "database_url" and isinstance(value, str):
        value = _without_password(value)
    info = Settings.model_fields.get(field)
    allowed = err.get("msg", "invalid")
    if info is not None and info.description:
        allowed = f"{allowed} ({info.description})"
    return f"configuration error: {name}={value!r} is not valid: {allowed}"


# Secrets that may come from a file instead: NAME_FILE=/path holds NAME's value (the
# Kubernetes and Docker secrets convention; docs/operations.md "Secrets from files").
SECRET_VARIABLES = (
    "HANGO_DATABASE_URL",
    "HANGO_CONSOLE_TOKENS",
    "HANGO_CONSOLE_PROXY_USERS",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
)
MAX_SECRET_FILE = 1 << 20


def _read_secret(file_var: str, path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SECRET_FILE + 1)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ConfigError(
            f"configuration error: {file_var}={path!r} cannot be read: {reason}"
        ) from None
    if len(data) > MAX_SECRET_FILE:
        raise ConfigError(f"configuration error: {file_var}={path!r} is larger than 1 MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"configuration error: {file_var}={path!r} is not UTF-8 text") from None
    text = text.removesuffix("\n").removesuffix("\r")  # `echo … > file` adds one
    if not text.strip():
        raise ConfigError(f"configuration error: {file_var}={path!r} is empty")
    if "\x00" in text:
        raise ConfigError(f"configuration error: {file_var}={path!r} holds a NUL character")
    return text


def load_secret_files(env: MutableMapping[str, str] | None = None) -> None:
    """For each NAME in SECRET_VARIABLES with NAME_FILE set: NAME = the file's text (one
    trailing newline removed), and NAME_FILE removed, in `env` (the process environment,
    where the anthropic SDK reads its key). ConfigError, one line, when the file cannot be
    read, is empty, or NAME is set as well."""
    env = os.environ if env is None else env
    for name in SECRET_VARIABLES:
        file_var = f"{name}_FILE"
        path = env.get(file_var)
        if path is None:
            continue
        if env.get(name):
            raise ConfigError(
                f"configuration error: both {name} and {file_var} are set; set only one"
            )
        env[name] = _read_secret(file_var, path)
        del env[file_var]


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment; ConfigError with one clear line on a bad value."""
    load_secret_files()
    try:
        return Settings(**overrides)
    except ValidationError as e:
        err = e.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "?"
        raise ConfigError(_describe(field, dict(err))) from None
    except SettingsError as e:  # a JSON setting that is not JSON
        field = str(e).split('"')[1] if '"' in str(e) else "?"
        raise ConfigError(
            f"configuration error: HANGO_{field.upper()} is not valid JSON ({e})"
        ) from None
