"""Choosing the CAS by URL: what ``cas.url`` accepts, what it refuses (at load, naming the setting), the
``[cas.s3]`` section's secret, and the adapter ``open_content_store`` returns for each form."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardfuse.pipeline.config.cas_location import FileLocation, S3Location, parse_cas_url
from shardfuse.pipeline.config.handoff import read_settings_file, write_settings_file
from shardfuse.pipeline.config.settings import Settings, load_settings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.storage.cas import LocalContentStore
from shardfuse.pipeline.storage.opening import open_content_store, open_s3_store
from shardfuse.pipeline.storage.s3_store import S3ContentStore

DIGEST = "ab" + "c" * 62


# No SHARDFUSE_* variable of the shell running the tests, and a HOME of its own (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("isolated_settings_env")


@pytest.mark.parametrize(
    ("url", "location"),
    [
        ("", None),
        ("file:///var/lib/shardfuse/cas", FileLocation(Path("/var/lib/shardfuse/cas"))),
        ("file://localhost/srv/cas", FileLocation(Path("/srv/cas"))),
        ("s3://my-bucket", S3Location("my-bucket", "")),
        ("s3://my-bucket/", S3Location("my-bucket", "")),
        ("s3://my.bucket-2/team/cas/", S3Location("my.bucket-2", "team/cas")),
        ("s3://bkt//a//b", S3Location("bkt", "a/b")),
    ],
)
def test_accepted_urls(url: str, location: FileLocation | S3Location | None) -> None:
    assert parse_cas_url(url) == location


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://minio:9000/bucket", "unsupported scheme 'http'"),
        ("/var/lib/cas", "unsupported scheme '(none)'"),
        ("file://server/share/cas", "not on host 'server'"),
        ("file://relative/../x", "not on host"),
        ("file:///", "absolute folder other than /"),
        ("s3://", "not a valid bucket name"),
        ("s3://My_Bucket/x", "not a valid bucket name"),
        ("s3://ab", "not a valid bucket name"),
        ("s3://AKIA:secret@bucket/x", "credentials do not belong in the URL"),
        ("s3://bucket/a/../b", "'.' or '..' segments"),
        ("s3://bucket/x?versionId=1", "no query or fragment"),
    ],
)
def test_refused_urls_fail_at_load_naming_the_setting(url: str, says: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cas.url") as info:
        parse_cas_url(url)
    assert says in str(info.value)
    config = tmp_path / "site.toml"
    config.write_text(f'[cas]\nurl = "{url}"\n')
    with pytest.raises(ConfigurationError, match=r"cas\.url"):
        load_settings(config)


@pytest.mark.parametrize("endpoint", ["127.0.0.1:8333", "ftp://host", "http://", "http://u:p@host:9000"])
def test_endpoint_must_be_an_http_url(endpoint: str) -> None:
    with pytest.raises(ValueError, match="cas.s3.endpoint_url"):
        Settings.model_validate({"cas": {"url": "s3://bkt", "s3": {"endpoint_url": endpoint}}})
    assert Settings.model_validate({"cas": {"s3": {"endpoint_url": "https://s3.example.com:9000"}}})


def test_s3_keys_go_together() -> None:
    with pytest.raises(ValueError, match="access_key_id and cas.s3.secret_access_key go together"):
        Settings.model_validate({"cas": {"url": "s3://bkt", "s3": {"access_key_id": "AKID"}}})
    settings = Settings.model_validate({"cas": {"url": "s3://bkt"}})  # neither: boto3's default chain
    assert settings.cas.s3.access_key_id == "" and not settings.cas.s3.secret_access_key.get_secret_value()


def test_the_secret_key_comes_from_the_environment_and_never_shows(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    monkeypatch.setenv("SHARDFUSE_CAS__URL", "s3://bkt/prefix")
    monkeypatch.setenv("SHARDFUSE_CAS__S3__ACCESS_KEY_ID", "AKID")
    monkeypatch.setenv("SHARDFUSE_CAS__S3__SECRET_ACCESS_KEY", "s3-very-SECRET")
    settings = load_settings()
    assert settings.cas.s3.secret_access_key.get_secret_value() == "s3-very-SECRET"
    assert "s3-very-SECRET" not in repr(settings) and "s3-very-SECRET" not in str(settings.cas)
    # Worker processes get exactly these settings, secret included, through the 0600 hand-off file.
    handed = read_settings_file(write_settings_file(settings, tmp_path / "resolved.json"))
    assert handed.cas == settings.cas
    assert handed.cas.s3.secret_access_key.get_secret_value() == "s3-very-SECRET"


def test_open_content_store_follows_the_url(tmp_path: Path) -> None:
    default = open_content_store(Settings(data_dir=tmp_path))
    assert isinstance(default, LocalContentStore) and default.root == tmp_path / "cas"
    folder = open_content_store(Settings(data_dir=tmp_path, cas={"url": f"file://{tmp_path / 'elsewhere'}"}))
    assert isinstance(folder, LocalContentStore) and folder.root == tmp_path / "elsewhere"
    # Opening an S3 CAS sends nothing (the endpoint below answers nobody): a store out of reach fails on use.
    s3_settings = Settings(data_dir=tmp_path, cas={"url": "s3://bkt/team/cas",
                                                   "s3": {"endpoint_url": "http://127.0.0.1:9"}})
    s3 = open_content_store(s3_settings)
    assert isinstance(s3, S3ContentStore)
    assert s3.key_for(f"sha256:{DIGEST}") == f"team/cas/ab/{DIGEST[2:]}"
    assert not (tmp_path / "cas").exists()  # an S3 CAS needs no data dir
    with pytest.raises(ConfigurationError, match="is not an s3:// URL"):
        open_s3_store(Settings(data_dir=tmp_path))


def test_keys_mirror_the_local_layout() -> None:
    assert S3Location("bkt", "").key_for(DIGEST) == f"ab/{DIGEST[2:]}"
    assert S3Location("bkt", "a/b").key_for(DIGEST) == f"a/b/ab/{DIGEST[2:]}"
    assert S3Location("bkt", "a/b").url == "s3://bkt/a/b" and S3Location("bkt").url == "s3://bkt"
