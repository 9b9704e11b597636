"""The embedded stack's generated passwords: made once per data dir (mode 0600), reused, and filled into the
settings of every process that resolves them, only where those point at that stack without a password."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from shardfuse.pipeline.config.handoff import read_settings_file, write_settings_file
from shardfuse.pipeline.config.redaction import secret_values
from shardfuse.pipeline.config.settings import load_settings
from shardfuse.pipeline.config.stack_secrets import (
    dsn_with_password,
    ensure_stack_secrets,
    load_stack_secrets,
    redis_url_with_password,
    secrets_file,
)
from shardfuse.pipeline.core.errors import ConfigurationError

REDIS, PG = 16379, 15432


def _stack(data_dir: Path, **extra: object) -> dict[str, object]:
    return {"data_dir": data_dir,
            "broker": {"url": f"redis://127.0.0.1:{REDIS}/0", "result_backend": f"redis://localhost:{REDIS}/1"},
            "postgres": {"dsn": f"postgresql://postgres@127.0.0.1:{PG}/shardfuse"}, **extra}  # fmt: skip


def test_passwords_are_made_once_private_and_reused(tmp_path: Path) -> None:
    assert load_stack_secrets(tmp_path) is None
    first, created = ensure_stack_secrets(tmp_path, redis_port=REDIS, postgres_port=PG)
    assert created and stat.S_IMODE(secrets_file(tmp_path).stat().st_mode) == 0o600
    assert len({first.redis_password, first.postgres_password}) == 2 and len(first.redis_password) >= 40
    assert first.redis_password not in repr(first) and first.postgres_password not in repr(first)
    secrets_file(tmp_path).chmod(0o644)
    again, created = ensure_stack_secrets(tmp_path, redis_port=REDIS, postgres_port=PG)
    assert again == first and not created
    assert stat.S_IMODE(secrets_file(tmp_path).stat().st_mode) == 0o600  # put back
    moved, _ = ensure_stack_secrets(tmp_path, redis_port=REDIS + 1, postgres_port=PG)  # the stack's new port
    assert (moved.redis_password, moved.redis_port) == (first.redis_password, REDIS + 1)
    assert load_stack_secrets(tmp_path) == moved
    assert not list(tmp_path.glob(".*.tmp"))


def test_settings_pointing_at_the_stack_get_its_passwords(tmp_path: Path) -> None:
    assert load_settings(**_stack(tmp_path)).broker.url == f"redis://127.0.0.1:{REDIS}/0"  # no up yet: unchanged
    found, _ = ensure_stack_secrets(tmp_path, redis_port=REDIS, postgres_port=PG)
    settings = load_settings(**_stack(tmp_path))
    assert settings.broker.url == f"redis://:{found.redis_password}@127.0.0.1:{REDIS}/0"
    assert settings.broker.result_backend == f"redis://:{found.redis_password}@localhost:{REDIS}/1"
    assert settings.postgres.dsn == f"postgresql://postgres:{found.postgres_password}@127.0.0.1:{PG}/shardfuse"
    assert set(secret_values(settings)) == {found.redis_password, found.postgres_password, "shardfuse"}
    assert found.redis_password not in repr(settings) and found.postgres_password not in repr(settings)
    # What a launcher hands its workers carries them as they are.
    assert read_settings_file(write_settings_file(settings, tmp_path / "run" / "settings.json")) == settings


@pytest.mark.parametrize("url", [
    "redis://:given@127.0.0.1:16379/0",      # a password of its own wins
    "redis://127.0.0.1:6379/0",              # another server on loopback
    "redis://cache.internal:16379/0",        # not this machine
    "rediss://127.0.0.1:16379/0",            # not the embedded server's scheme
])  # fmt: skip
def test_other_redis_urls_are_left_alone(url: str) -> None:
    assert redis_url_with_password(url, "pw", port=REDIS) == url


@pytest.mark.parametrize("dsn", [
    "postgresql://postgres:given@127.0.0.1:15432/x",
    "host=127.0.0.1 port=15432 user=u password=given dbname=x",
    "postgresql://postgres@127.0.0.1:5432/x",
    "postgresql://postgres@db.internal:15432/x",
    "postgresql://postgres@/x?host=/run/postgresql",
    "host=127.0.0.1,127.0.0.2 port=15432 dbname=x",
])  # fmt: skip
def test_other_dsns_are_left_alone(dsn: str) -> None:
    assert dsn_with_password(dsn, "pw", port=PG) == dsn


def test_every_spelling_of_the_stack_address_gets_the_password() -> None:
    assert redis_url_with_password("redis://default@[::1]:16379/0", "p w", port=REDIS) == "redis://default:p%20w@[::1]:16379/0"
    assert "password=pw" in dsn_with_password("host=localhost port=15432 user=u dbname=x", "pw", port=PG)
    assert "password=pw" in dsn_with_password("postgresql://127.0.0.1:15432/x", "pw", port=PG)


def test_a_damaged_file_is_a_clear_error_that_shows_nothing_of_it(tmp_path: Path) -> None:
    secrets_file(tmp_path).write_text('{"redis": {"password": "half-a-secret"')
    with pytest.raises(ConfigurationError, match="damaged") as caught:
        load_settings(**_stack(tmp_path))
    assert "half-a-secret" not in str(caught.value)


# -- the object store's S3 keys ------------------------------------------------------------------------------

S3 = 18333


def _s3_cas(endpoint: str, **s3: object) -> dict[str, object]:
    return {"cas": {"url": "s3://shardfuse/cas", "s3": {"endpoint_url": endpoint, **s3}}}


def test_a_file_from_before_the_object_store_loads_and_gets_keys_added(tmp_path: Path) -> None:
    old = {"version": 1, "redis": {"password": "r" * 43, "port": REDIS}, "postgres": {"password": "p" * 43, "port": PG}}
    secrets_file(tmp_path).write_text(json.dumps(old))
    loaded = load_stack_secrets(tmp_path)
    assert loaded is not None and loaded.object_store is None
    found, created = ensure_stack_secrets(tmp_path, redis_port=REDIS, postgres_port=PG, s3_port=S3)
    assert not created and (found.redis_password, found.postgres_password) == ("r" * 43, "p" * 43)
    assert found.object_store is not None and found.object_store.port == S3
    assert len(found.object_store.access_key_id) == 20 and len(found.object_store.secret_access_key) >= 40
    assert found.object_store.secret_access_key not in repr(found)
    assert load_stack_secrets(tmp_path) == found
    assert stat.S_IMODE(secrets_file(tmp_path).stat().st_mode) == 0o600
    # An `up` whose CAS is not the embedded store keeps the keys and the port last served.
    again, _ = ensure_stack_secrets(tmp_path, redis_port=REDIS, postgres_port=PG)
    assert again == found


def test_settings_naming_the_embedded_object_store_get_its_keys(tmp_path: Path) -> None:
    found, _ = ensure_stack_secrets(tmp_path, redis_port=REDIS, postgres_port=PG, s3_port=S3)
    assert found.object_store is not None
    for endpoint in (f"http://127.0.0.1:{S3}", f"http://localhost:{S3}/"):
        s3 = load_settings(**_stack(tmp_path, **_s3_cas(endpoint))).cas.s3
        assert (s3.access_key_id, s3.secret_access_key.get_secret_value()) == (
            found.object_store.access_key_id, found.object_store.secret_access_key)
    settings = load_settings(**_stack(tmp_path, **_s3_cas(f"http://127.0.0.1:{S3}")))
    assert found.object_store.secret_access_key not in repr(settings)
    assert read_settings_file(write_settings_file(settings, tmp_path / "run" / "settings.json")) == settings


@pytest.mark.parametrize("cas", [
    _s3_cas(f"http://127.0.0.1:{S3}", access_key_id="mine", secret_access_key="given"),  # its own keys win
    _s3_cas(f"http://127.0.0.1:{S3 + 10}"),                  # another store on loopback
    _s3_cas(f"https://127.0.0.1:{S3}"),                      # not the embedded store's scheme
    _s3_cas(f"http://minio.internal:{S3}"),                  # not this machine
    _s3_cas(""),                                            # AWS S3
    {"cas": {"s3": {"endpoint_url": f"http://127.0.0.1:{S3}"}}},  # the local folder CAS
])  # fmt: skip
def test_other_object_stores_are_left_alone(tmp_path: Path, cas: dict[str, object]) -> None:
    ensure_stack_secrets(tmp_path, redis_port=REDIS, postgres_port=PG, s3_port=S3)
    given = load_settings(**{**_stack(tmp_path), **cas}).cas.s3
    expected = cas["cas"]["s3"]  # type: ignore[index]
    assert given.access_key_id == expected.get("access_key_id", "")
    assert given.secret_access_key.get_secret_value() == expected.get("secret_access_key", "")
