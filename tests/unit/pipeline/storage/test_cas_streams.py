"""Streaming through the CAS (``put_file``, ``copy_to``): the local and in-memory stores behave alike, verify
what they hand out, and keep a caller's bad file apart from the store's own trouble."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from shardfuse.pipeline.core.errors import ContentNotFoundError, PermanentError, StoreUnavailableError
from shardfuse.pipeline.storage.cas import ContentStore, InMemoryContentStore, LocalContentStore, hash_content
from shardfuse.pipeline.storage.streams import CHUNK_BYTES, file_hash

MISSING = "sha256:" + "0" * 64


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ContentStore:
    if request.param == "local":
        return LocalContentStore(tmp_path / "cas")
    return InMemoryContentStore()


@pytest.fixture
def big_file(tmp_path: Path) -> tuple[Path, bytes]:
    data = os.urandom(3 * CHUNK_BYTES + 123)  # several chunks and a short last one
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    return path, data


def test_put_file_names_content_as_put_does_and_copy_to_returns_it(store: ContentStore,
                                                                   big_file: tuple[Path, bytes]) -> None:
    path, data = big_file
    name, size = store.put_file(path)
    assert name == hash_content(data) == file_hash(path) and size == len(data)
    assert store.put_file(path) == (name, size) and store.put(data) == name  # idempotent, whichever way
    out = io.BytesIO(b"kept:")
    out.seek(0, io.SEEK_END)
    assert store.copy_to(name, out) == len(data)
    assert out.getvalue() == b"kept:" + data  # appended where out stood
    assert store.get(name) == data and store.size(name) == len(data)


def test_get_within_reads_content_up_to_the_limit_and_only_sizes_larger(store: ContentStore) -> None:
    name = store.put(b"x" * 100)
    assert store.get_within(name, 100) == (100, b"x" * 100)
    assert store.get_within(name, 99) == (100, None)
    with pytest.raises(ContentNotFoundError, match="shardfuse deadletters retry"):
        store.get_within(MISSING, 100)


def test_copy_to_of_missing_content(store: ContentStore) -> None:
    with pytest.raises(ContentNotFoundError, match="shardfuse deadletters retry"):
        store.copy_to(MISSING, io.BytesIO())


def test_a_missing_source_file_is_the_callers_error_not_the_store_being_down(store: ContentStore,
                                                                              tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        store.put_file(tmp_path / "nothing-here")


def test_local_put_file_leaves_only_the_content_file(tmp_path: Path, big_file: tuple[Path, bytes]) -> None:
    store = LocalContentStore(tmp_path / "cas")
    name = store.put_file(big_file[0]).content_hash
    store.put_file(big_file[0])
    assert sorted(p.relative_to(store.root) for p in store.root.rglob("*") if p.is_file()) == [
        store.path_for(name).relative_to(store.root)]
    assert store.path_for(name).stat().st_mode & 0o777 == 0o644


def test_local_copy_to_verifies_the_content(tmp_path: Path, big_file: tuple[Path, bytes]) -> None:
    store = LocalContentStore(tmp_path / "cas")
    name = store.put_file(big_file[0]).content_hash
    store.path_for(name).write_bytes(b"tampered")
    with pytest.raises(PermanentError, match="corrupt CAS file .*delete it and publish the content again"):
        store.copy_to(name, io.BytesIO())


def test_local_put_file_into_a_broken_cas_is_the_store_unavailable(tmp_path: Path,
                                                                   big_file: tuple[Path, bytes]) -> None:
    root = tmp_path / "cas"
    root.write_bytes(b"")  # not a folder: every write under it fails
    with pytest.raises(StoreUnavailableError, match=f"in the CAS at {root}"):
        LocalContentStore(root).put_file(big_file[0])


def test_local_put_file_of_content_held_already_writes_nothing(tmp_path: Path, big_file: tuple[Path, bytes],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalContentStore(tmp_path / "cas")
    stored = store.path_for(store.put(big_file[1]))
    before = stored.stat().st_mtime_ns, stored.stat().st_ino

    def no_temporary_file(*args: object, **kwargs: object) -> None:
        raise AssertionError("a temporary file was made for content the CAS holds")

    monkeypatch.setattr("shardfuse.pipeline.storage.cas.tempfile.mkstemp", no_temporary_file)
    assert store.put_file(big_file[0]) == (hash_content(big_file[1]), len(big_file[1]))  # no copy, no sync
    assert (stored.stat().st_mtime_ns, stored.stat().st_ino) == before
