"""Resolved settings handed to child processes as a private file (pipeline/config/handoff.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from shardfuse.pipeline.config.handoff import (
    RESOLVED_SETTINGS_ENV,
    process_settings,
    read_settings_file,
    write_settings_file,
)
from shardfuse.pipeline.config.redaction import secret_values
from shardfuse.pipeline.config.settings import Settings, load_settings
from shardfuse.pipeline.core.errors import ConfigurationError

# No SHARDFUSE_* variable of the shell running the tests, and a HOME of its own (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("isolated_settings_env")


def resolved(tmp_path: Path) -> Settings:
    """Settings that differ from the defaults everywhere a child could go wrong: secrets, nested sections,
    a dict of sections, paths."""
    return load_settings(
        data_dir=tmp_path / "data", shards=3,
        broker={"url": "redis://:br0ker-pw@127.0.0.1:6390/0", "visibility_timeout_s": 4321},
        postgres={"dsn": "postgresql://postgres:pg-pw@127.0.0.1:5439/x"},
        embedder={"provider": "openai", "api_key": "sk-embedder-key", "dimensions": 1536},
        embedders={"mini": {"provider": "hashing", "dimensions": 48}},
        query={"zone_profiles": {"code": {"fusion": "rrf"}}, "expansion": {"api_key": "sk-expansion"}},
        context={"api_key": "sk-context"}, flower={"password": "fl0wer"}, cas={"root": "/srv/cas"},
    )  # fmt: skip


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_written_file_reads_back_as_equal_settings_secrets_included(tmp_path: Path) -> None:
    settings = resolved(tmp_path)
    path = write_settings_file(settings)
    try:
        back = read_settings_file(path)
        assert back == settings
        assert secret_values(back) == secret_values(settings) and len(secret_values(back)) == 6
        assert mode(path) == 0o600  # it holds the secrets
    finally:
        path.unlink()


def test_a_named_file_is_replaced_whole_and_stays_private(tmp_path: Path) -> None:
    target = tmp_path / "run" / "settings.json"
    os.umask(old := os.umask(0o022))
    write_settings_file(Settings(shards=1), target)
    assert write_settings_file(resolved(tmp_path), target) == target
    assert read_settings_file(target).shards == 3
    assert mode(target) == 0o600
    assert [p.name for p in target.parent.iterdir()] == ["settings.json"]  # no temporary file left
    assert old == os.umask(old)


def test_the_file_wins_over_the_childs_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = resolved(tmp_path)
    path = write_settings_file(settings, tmp_path / "settings.json")
    monkeypatch.setenv("SHARDFUSE_SHARDS", "5")
    monkeypatch.setenv("SHARDFUSE_EMBEDDERS__OTHER__PROVIDER", "hashing")  # would add a model if merged
    config = tmp_path / "other.toml"
    config.write_text("shards = 6\n")
    monkeypatch.setenv("SHARDFUSE_CONFIG", str(config))
    assert process_settings({RESOLVED_SETTINGS_ENV: str(path)}) == settings


def test_without_the_variable_a_process_resolves_file_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDFUSE_SHARDS", "5")
    assert process_settings({}).shards == 5
    assert process_settings({RESOLVED_SETTINGS_ENV: ""}).shards == 5


def test_a_missing_or_broken_file_is_a_configuration_error_that_shows_no_secret(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    with pytest.raises(ConfigurationError, match="cannot read the resolved settings"):
        process_settings({RESOLVED_SETTINGS_ENV: str(path)})
    path.write_text('{"shards": "three", "flower": {"password": "fl0wer"}}')
    with pytest.raises(ConfigurationError, match="shards") as caught:
        read_settings_file(path)
    assert "fl0wer" not in str(caught.value)
