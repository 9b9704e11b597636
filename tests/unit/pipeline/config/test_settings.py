from __future__ import annotations

import os
import threading
import tomllib
from pathlib import Path

import pytest

from shardfuse.pipeline.config.settings import CONFIG_ENV, EmbedderProvider, Settings, load_settings
from shardfuse.pipeline.core.errors import ConfigurationError
from tests.support.paths import REPO

DEFAULT_TOML = REPO / "config" / "default.toml"


# No SHARDFUSE_* variable of the shell running the tests, and a HOME of its own (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("isolated_settings_env")


def test_default_toml_spells_out_the_builtin_defaults() -> None:
    from_file = load_settings(DEFAULT_TOML)
    assert from_file.model_dump() == Settings().model_dump()
    # ...and names every section the settings object has, so nothing is configurable only by surprise.
    assert set(tomllib.loads(DEFAULT_TOML.read_text())) == set(Settings.model_fields)


def test_environment_overrides_file_which_overrides_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "site.toml"
    config.write_text('shards = 4\n[embedder]\nprovider = "hashing"\nbatch_size = 16\n')
    settings = load_settings(config)
    assert settings.shards == 4 and settings.embedder.provider is EmbedderProvider.HASHING
    monkeypatch.setenv("SHARDFUSE_SHARDS", "3")
    monkeypatch.setenv("SHARDFUSE_EMBEDDER__BATCH_SIZE", "8")
    settings = load_settings(config)
    assert settings.shards == 3 and settings.embedder.batch_size == 8
    assert settings.embedder.provider is EmbedderProvider.HASHING  # untouched keys keep the file's value


def test_bad_settings_are_configuration_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match=r"does not exist \(named by --config\)"):
        load_settings(tmp_path / "missing.toml")
    # A deployment's SHARDFUSE_CONFIG pointing at nothing (a mount that failed) is an error, not the defaults.
    monkeypatch.setenv("SHARDFUSE_CONFIG", str(tmp_path / "unmounted.toml"))
    with pytest.raises(ConfigurationError, match="unmounted.toml does not exist \\(named by SHARDFUSE_CONFIG\\)"):
        load_settings()
    monkeypatch.delenv("SHARDFUSE_CONFIG")
    monkeypatch.setenv("SHARDFUSE_CHUNKING__OVERLAP_TOKENS", "600")
    with pytest.raises(ConfigurationError, match="overlap"):
        load_settings()
    monkeypatch.delenv("SHARDFUSE_CHUNKING__OVERLAP_TOKENS")
    monkeypatch.setenv("SHARDFUSE_BROKER__VISIBILITY_TIMEOUT_S", "100")
    with pytest.raises(ConfigurationError, match="visibility_timeout"):
        load_settings()


def test_secrets_never_reach_reprs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDFUSE_FLOWER__PASSWORD", "hunter2")
    settings = load_settings()
    assert "hunter2" not in repr(settings) and "hunter2" not in str(settings.model_dump())
    assert settings.flower.password.get_secret_value() == "hunter2"


def test_relative_paths_live_under_the_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SHARDFUSE_DATA_DIR", str(tmp_path))
    settings = load_settings()
    assert settings.cas_root == tmp_path / "cas" and settings.bm25_root == tmp_path / "bm25"
    monkeypatch.setenv("SHARDFUSE_SHARDS", "2")
    monkeypatch.setenv("SHARDFUSE_POSTGRES__SHARD_DSNS", '["postgresql://a/x", "postgresql://b/y"]')
    assert load_settings().shard_dsn(1) == "postgresql://b/y"


def test_zone_profiles_override_fusion_defaults_per_zone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "profiles.toml"
    config.write_text('[query.zone_profiles."code"]\nfusion = "convex"\nalpha = 0.8\n'
                      '[query.zone_profiles."docs"]\nalpha = 0.3\n')
    monkeypatch.setenv("SHARDFUSE_CONFIG", str(config))
    query = load_settings().query
    assert query.fusion_defaults("code") == ("convex", 0.8)
    assert query.fusion_defaults("docs") == (query.fusion, 0.3)  # only what the profile names
    assert query.fusion_defaults("other") == (query.fusion, query.alpha)
    assert query.fusion_defaults(None) == (query.fusion, query.alpha)  # a bad zone is rejected later
    config.write_text('[query.zone_profiles."code"]\nfusion = "borda"\n')
    with pytest.raises(ConfigurationError):
        load_settings()


def test_loading_settings_never_writes_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "site.toml"
    config.write_text("shards = 4\n")
    before = dict(os.environ)
    settings = load_settings(config, data_dir=tmp_path / "data")
    assert settings.shards == 4 and settings.data_dir == tmp_path / "data"
    assert dict(os.environ) == before


def test_the_file_argument_wins_over_shardfuse_config_which_is_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    named, given = tmp_path / "named.toml", tmp_path / "given.toml"
    named.write_text("shards = 5\n[flower]\nuser = \"named\"\n")
    given.write_text("shards = 6\n")
    monkeypatch.setenv(CONFIG_ENV, str(named))
    assert load_settings().shards == 5  # compose, k8s and the image name the file this way
    settings = load_settings(given)
    assert settings.shards == 6 and settings.flower.user == "shardfuse"  # nothing of the other file
    assert os.environ[CONFIG_ENV] == str(named)


def test_keyword_overrides_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDFUSE_SHARDS", "3")
    monkeypatch.setenv("SHARDFUSE_EMBEDDER__MODEL", "from-env")
    settings = load_settings(shards=7, embedder={"provider": "hashing"})
    assert settings.shards == 7
    assert settings.embedder.provider is EmbedderProvider.HASHING and settings.embedder.model == "from-env"


def test_threads_loading_different_files_each_get_their_own(tmp_path: Path) -> None:
    files = []
    for shards in range(1, 9):
        files.append(tmp_path / f"s{shards}.toml")
        files[-1].write_text(f"shards = {shards}\n")
    loaded: dict[int, list[int]] = {}
    barrier = threading.Barrier(len(files))

    def load(index: int) -> None:
        barrier.wait()
        loaded[index] = [load_settings(files[index]).shards for _ in range(20)]

    threads = [threading.Thread(target=load, args=(i,)) for i in range(len(files))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert loaded == {i: [i + 1] * 20 for i in range(len(files))}
