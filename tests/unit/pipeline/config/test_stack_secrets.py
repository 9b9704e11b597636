"""The embedded stack's generated passwords: made once per data dir (mode 0600), reused, and filled into the
settings of every process that resolves them, only where those point at that stack without a password."""

from __future__ import annotations

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
