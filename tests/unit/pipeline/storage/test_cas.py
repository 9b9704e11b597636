"""The content-addressed store: local filesystem adapter and the in-memory fake behave alike."""

from __future__ import annotations

import hashlib
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shardfuse.pipeline.core.errors import (
    ContentNotFoundError,
    InvalidEventError,
    PermanentError,
    StoreUnavailableError,
)
from shardfuse.pipeline.storage.cas import ContentStore, InMemoryContentStore, LocalContentStore, hash_content

DATA = b"print('hello')\n"
DATA_HASH = "sha256:" + hashlib.sha256(DATA).hexdigest()
MISSING = "sha256:" + "0" * 64


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ContentStore:
    if request.param == "local":
        return LocalContentStore(tmp_path / "cas")
    return InMemoryContentStore()


def test_put_returns_sha256_and_get_returns_bytes(store: ContentStore) -> None:
    assert store.put(DATA) == DATA_HASH == hash_content(DATA)
    assert store.get(DATA_HASH) == DATA
    assert store.exists(DATA_HASH)


def test_put_is_idempotent(store: ContentStore) -> None:
    assert store.put(DATA) == store.put(DATA)
    assert store.get(DATA_HASH) == DATA


def test_empty_content_is_storable(store: ContentStore) -> None:
    name = store.put(b"")
    assert name == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert store.get(name) == b""


def test_missing_content(store: ContentStore) -> None:
    assert not store.exists(MISSING)
    with pytest.raises(ContentNotFoundError, match=MISSING):
        store.get(MISSING)


@pytest.mark.parametrize(
    "bad",
    [
        "sha256:../../../../etc/passwd",
        "sha256:" + "A" * 64,
        "sha256:" + "0" * 63,
        "sha256:" + "0" * 64 + "/..",
        "md5:" + "0" * 64,
        "0" * 64,
        "",
    ],
)
def test_malformed_hashes_are_rejected(store: ContentStore, bad: str) -> None:
    with pytest.raises(InvalidEventError):
        store.get(bad)
    with pytest.raises(InvalidEventError):
        store.exists(bad)


def test_local_layout_is_two_hex_then_sixty_two(tmp_path: Path) -> None:
    store = LocalContentStore(tmp_path)
    name = store.put(DATA)
    digest = name.removeprefix("sha256:")
    path = tmp_path / digest[:2] / digest[2:]
    assert path.read_bytes() == DATA
    assert store.path_for(name) == path
    # No temporary file is left behind, and other users (workers under another uid) can read it.
    assert sorted(p.name for p in path.parent.iterdir()) == [digest[2:]]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_local_put_does_not_rewrite_existing_content(tmp_path: Path) -> None:
    store = LocalContentStore(tmp_path)
    path = store.path_for(store.put(DATA))
    before = path.stat().st_mtime_ns, path.stat().st_ino
    store.put(DATA)
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == before


def test_local_concurrent_puts_of_the_same_content(tmp_path: Path) -> None:
    store = LocalContentStore(tmp_path)
    blob = DATA * 10_000
    with ThreadPoolExecutor(max_workers=8) as pool:
        names = set(pool.map(lambda _: store.put(blob), range(32)))
    assert names == {hash_content(blob)}
    assert store.get(hash_content(blob)) == blob
    folder = store.path_for(hash_content(blob)).parent
    assert len(list(folder.iterdir())) == 1


def test_local_corrupt_file_is_a_permanent_error(tmp_path: Path) -> None:
    store = LocalContentStore(tmp_path)
    name = store.put(DATA)
    store.path_for(name).write_bytes(b"tampered")
    with pytest.raises(PermanentError, match="corrupt CAS file") as info:
        store.get(name)
    assert not isinstance(info.value, ContentNotFoundError)
    assert "delete the file and publish the content again" in str(info.value)


def test_local_store_reads_what_another_instance_wrote(tmp_path: Path) -> None:
    name = LocalContentStore(tmp_path).put(DATA)
    assert LocalContentStore(tmp_path).get(name) == DATA


def test_local_missing_content_is_permanent_even_before_anything_was_stored(tmp_path: Path) -> None:
    store = LocalContentStore(tmp_path / "never-written")
    with pytest.raises(ContentNotFoundError, match="shardfuse deadletters retry"):
        store.size(MISSING)
    with pytest.raises(ContentNotFoundError):
        store.get(MISSING)


def test_local_filesystem_trouble_is_the_store_unavailable_not_missing_content(tmp_path: Path) -> None:
    root = tmp_path / "cas"
    root.write_bytes(b"")  # the CAS volume is not what it should be: every path under it fails
    store = LocalContentStore(root)
    for action in (lambda: store.put(DATA), lambda: store.get(DATA_HASH), lambda: store.size(DATA_HASH)):
        with pytest.raises(StoreUnavailableError, match=f"in the CAS at {root}") as info:
            action()
        assert isinstance(info.value.__cause__, OSError)
        assert not isinstance(info.value, PermanentError)


def test_local_unreadable_content_file_is_the_store_unavailable(tmp_path: Path) -> None:
    store = LocalContentStore(tmp_path)
    store.path_for(DATA_HASH).mkdir(parents=True)  # a directory where the file should be: read fails
    with pytest.raises(StoreUnavailableError, match=f"cannot read {DATA_HASH}"):
        store.get(DATA_HASH)
