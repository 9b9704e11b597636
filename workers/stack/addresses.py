"""Where each component of the embedded stack listens, parsed from the settings (pure, no I/O).

Redis and PostgreSQL are configured once, by ``broker.url`` and ``postgres.dsn``: the launcher binds the
servers to exactly the address clients will use. The embedded stack is a single-machine stack: it only ever
binds to loopback, and its servers require passwords (Redis ``requirepass``, PostgreSQL scram-sha-256): those
in ``broker.url`` and ``postgres.dsn``, else the data dir's generated ones
(:mod:`shardfuse.pipeline.config.stack_secrets`).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

import psycopg.conninfo

from shardfuse.pipeline.config.redaction import redact_url
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.config.stack_secrets import is_loopback
from shardfuse.pipeline.core.errors import ConfigurationError

DEFAULT_REDIS_PORT = 6379
DEFAULT_POSTGRES_PORT = 5432


@dataclass(frozen=True)
class Endpoint:
    """A TCP address on this machine."""

    host: str
    port: int

    @property
    def url_host(self) -> str:
        """The host as it appears in a URL (IPv6 literals need brackets)."""
        return f"[{self.host}]" if ":" in self.host else self.host


@dataclass(frozen=True)
class PostgresTarget:
    """The server address, role and database a DSN names."""

    endpoint: Endpoint
    user: str
    dbname: str


@dataclass(frozen=True)
class StackAddresses:
    """Every address of the embedded stack, each checked to be loopback."""

    redis: Endpoint
    postgres: PostgresTarget
    flower: Endpoint
    api: Endpoint | None = None  # the HTTP API, when ``stack.api_port`` is not 0

    @property
    def flower_url(self) -> str:
        return f"http://{self.flower.url_host}:{self.flower.port}/"

    @classmethod
    def from_settings(cls, settings: Settings) -> StackAddresses:
        """Parse ``broker.url``, ``postgres.dsn`` and the stack's ports; refuse non-loopback hosts."""
        redis = parse_redis_url(settings.broker.url)
        postgres = parse_postgres_dsn(settings.postgres.dsn)
        require_loopback(redis.host, what="broker.url")
        require_loopback(postgres.endpoint.host, what="postgres.dsn")
        # Flower is reachable from wherever the broker is, which is loopback by now.
        api = Endpoint(redis.host, settings.stack.api_port) if settings.stack.api_port else None
        return cls(redis=redis, postgres=postgres, flower=Endpoint(redis.host, settings.stack.flower_port), api=api)


def parse_redis_url(url: str) -> Endpoint:
    """``redis://HOST:PORT/DB`` -> Endpoint(HOST, PORT); the port defaults to 6379."""
    parts = urlsplit(url)
    if parts.scheme != "redis":
        raise ConfigurationError(f"broker.url must be a redis:// URL for the embedded stack, got {redact_url(url)!r}")
    if not parts.hostname:
        raise ConfigurationError(f"broker.url {redact_url(url)!r} names no host")
    try:
        port = parts.port or DEFAULT_REDIS_PORT
    except ValueError as exc:
        raise ConfigurationError(f"broker.url {redact_url(url)!r} has an invalid port") from exc
    return Endpoint(parts.hostname, port)


def parse_postgres_dsn(dsn: str) -> PostgresTarget:
    """A libpq DSN (URL or ``key=value`` form) -> host, port, user and database name.

    libpq's own parser is used so that every spelling a client accepts is understood the same way here.
    """
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ConfigurationError(f"postgres.dsn is not a valid libpq connection string: {exc}") from exc
    host = str(params.get("host") or "")
    if not host or host.startswith("/") or "," in host:
        # A socket directory or a multi-host list cannot be where *we* start one TCP server.
        raise ConfigurationError(f"postgres.dsn must name exactly one TCP host for the embedded stack, got {host!r}")
    try:
        port = int(params.get("port") or DEFAULT_POSTGRES_PORT)
    except ValueError as exc:
        raise ConfigurationError(f"postgres.dsn has an invalid port {params.get('port')!r}") from exc
    user = str(params.get("user") or "postgres")
    dbname = str(params.get("dbname") or user)
    return PostgresTarget(Endpoint(host, port), user=user, dbname=dbname)


def require_loopback(host: str, *, what: str) -> None:
    """Raise ConfigurationError unless ``host`` is loopback: the embedded stack serves this machine only."""
    if not is_loopback(host):
        raise ConfigurationError(
            f"{what} points at {host!r}, but the embedded stack only listens on loopback "
            "(127.0.0.1, ::1 or localhost); use an external Redis/PostgreSQL for other hosts"
        )
