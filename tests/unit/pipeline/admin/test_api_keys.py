"""The HTTP API's keys: hashed at rest, shown once, bound to zones, revocable at once."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from shardfuse.pipeline.admin.api_keys import KeyRing, KeyStore, hash_token
from shardfuse.pipeline.config.api import ApiKeyEntry
from shardfuse.pipeline.core.errors import ConfigurationError


def test_a_created_key_is_stored_hashed_private_and_authenticates(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "api-keys.json")
    key, token = store.create(name="ci", read=["docs", "code"], write=["docs"])
    text = store.path.read_text()
    assert token not in text and hash_token(token) in text  # the token itself is never written
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    ring = KeyRing(store=store)
    found = ring.authenticate(token)
    assert found is not None and found.name == "ci"
    assert found.may_read("code") and found.may_write("docs") and not found.may_write("code")
    assert not found.may_read("other")
    assert ring.authenticate(token + "x") is None and ring.authenticate("") is None


def test_a_revoked_key_is_refused_at_the_next_request(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "api-keys.json")
    _, keep = store.create(name="keep", read=["a"], write=[])
    _, gone = store.create(name="gone", read=["a"], write=[])
    ring = KeyRing(store=store)
    assert ring.authenticate(gone) is not None
    store.revoke("gone")
    assert ring.authenticate(gone) is None and ring.authenticate(keep) is not None
    with pytest.raises(ConfigurationError, match="no API key named 'gone'"):
        store.revoke("gone")


def test_keys_from_the_settings_need_no_file(tmp_path: Path) -> None:
    token = "sfk_abc_" + "x" * 43
    entry = ApiKeyEntry(name="deploy", sha256=hash_token(token), read=("*",), write=("a",))
    ring = KeyRing(store=KeyStore(tmp_path / "missing.json"), configured=[entry])
    key = ring.authenticate(token)
    assert key is not None and key.source == "settings" and key.may_read("anything") and not key.may_write("b")


def test_bad_input_is_refused_with_a_reason(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "api-keys.json")
    with pytest.raises(ConfigurationError, match="is not a zone name"):
        store.create(name="x", read=["no/slashes"], write=[])
    with pytest.raises(ConfigurationError, match="at least one zone"):
        store.create(name="x", read=[], write=[])
    store.create(name="x", read=["a"], write=[])
    with pytest.raises(ConfigurationError, match="exists already"):
        store.create(name="x", read=["a"], write=[])
    store.path.write_text("{not json")
    with pytest.raises(ConfigurationError, match="cannot read the API key store"):
        store.load()
    with pytest.raises(ValueError, match="not a key hash"):
        ApiKeyEntry(name="bad", sha256="abc")
