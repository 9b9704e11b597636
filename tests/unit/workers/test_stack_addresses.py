"""Where the embedded stack listens: parsing broker URL and DSN, and refusing non-loopback hosts."""

from __future__ import annotations

import pytest

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.workers.stack.addresses import (
    Endpoint,
    StackAddresses,
    is_loopback,
    parse_postgres_dsn,
    parse_redis_url,
    require_loopback,
)


def test_redis_url_gives_host_and_port() -> None:
    assert parse_redis_url("redis://127.0.0.1:16379/0") == Endpoint("127.0.0.1", 16379)


def test_redis_url_port_defaults_to_6379() -> None:
    assert parse_redis_url("redis://localhost/3") == Endpoint("localhost", 6379)


def test_redis_url_ipv6_literal() -> None:
    endpoint = parse_redis_url("redis://[::1]:7000/0")
    assert endpoint == Endpoint("::1", 7000)
    assert endpoint.url_host == "[::1]"


@pytest.mark.parametrize("url", ["rediss://127.0.0.1:6379/0", "amqp://127.0.0.1//", "redis:///0"])
def test_redis_url_refuses_what_we_cannot_start(url: str) -> None:
    with pytest.raises(ConfigurationError):
        parse_redis_url(url)


def test_dsn_url_form() -> None:
    target = parse_postgres_dsn("postgresql://postgres@127.0.0.1:15432/shardfuse")
    assert target.endpoint == Endpoint("127.0.0.1", 15432)
    assert (target.user, target.dbname) == ("postgres", "shardfuse")


def test_dsn_keyword_form_and_defaults() -> None:
    target = parse_postgres_dsn("host=localhost dbname=idx")
    assert target.endpoint == Endpoint("localhost", 5432)
    assert (target.user, target.dbname) == ("postgres", "idx")


def test_dsn_database_defaults_to_user() -> None:
    assert parse_postgres_dsn("postgresql://alice@127.0.0.1:5433").dbname == "alice"


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql:///shardfuse",  # no host: a unix socket
        "postgresql://postgres@/shardfuse?host=/var/run/postgresql",
        "postgresql://postgres@127.0.0.1,127.0.0.2/shardfuse",  # multi-host
        "postgresql://postgres@127.0.0.1:notaport/shardfuse",
        "this is not a dsn",
    ],
)
def test_dsn_refuses_what_we_cannot_start(dsn: str) -> None:
    with pytest.raises(ConfigurationError):
        parse_postgres_dsn(dsn)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost", "LOCALHOST"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)
    require_loopback(host, what="broker.url")


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "::", "redis", "db.example.com"])
def test_non_loopback_hosts_are_refused(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(ConfigurationError, match="loopback"):
        require_loopback(host, what="broker.url")


def test_addresses_from_default_settings() -> None:
    addresses = StackAddresses.from_settings(Settings())
    assert addresses.redis == Endpoint("127.0.0.1", 16379)
    assert addresses.postgres.endpoint == Endpoint("127.0.0.1", 15432)
    assert addresses.flower == Endpoint("127.0.0.1", 15555)
    assert addresses.flower_url == "http://127.0.0.1:15555/"


def test_settings_with_remote_broker_are_refused() -> None:
    settings = Settings(broker={"url": "redis://10.1.2.3:6379/0"})
    with pytest.raises(ConfigurationError, match="broker.url"):
        StackAddresses.from_settings(settings)


def test_settings_with_remote_postgres_are_refused() -> None:
    settings = Settings(postgres={"dsn": "postgresql://postgres@db.internal:5432/shardfuse"})
    with pytest.raises(ConfigurationError, match="postgres.dsn"):
        StackAddresses.from_settings(settings)
