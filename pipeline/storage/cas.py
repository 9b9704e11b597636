"""The content-addressed store (CAS): a port and its adapters.

Content is named by ``"sha256:<64 hex>"``. Events carry only the hash; workers read the bytes from here.

Adapters raise only our errors: content the store does not hold is a
:class:`~shardfuse.pipeline.core.errors.ContentNotFoundError` (permanent: the ingest stage dead-letters the
event with a reason saying how to recover); the store itself out of reach (a disk full or failing, a
permission, a network filesystem gone) is a
:class:`~shardfuse.pipeline.core.errors.StoreUnavailableError` (retried).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Protocol

from shardfuse.pipeline.core.durable_files import atomic_write_bytes, fsync_dir
from shardfuse.pipeline.core.errors import ContentNotFoundError, PermanentError, StoreUnavailableError
from shardfuse.pipeline.core.events import hex_digest
from shardfuse.pipeline.storage.streams import (
    Bounded,
    Stored,
    copy_hashing,
    copy_verified,
    hashed_file,
    read_chunks,
)


def hash_content(data: bytes) -> str:
    """The CAS name of ``data``: ``"sha256:<hex>"``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


class ContentStore(Protocol):
    """Where content lives, keyed by its hash."""

    def put(self, data: bytes) -> str:
        """Store ``data`` (idempotent) and return its hash ``"sha256:<hex>"``."""
        ...

    def get(self, content_hash: str) -> bytes:
        """The bytes stored under ``content_hash``; :class:`ContentNotFoundError` if there are none."""
        ...

    def exists(self, content_hash: str) -> bool:
        """Whether content is stored under ``content_hash``."""
        ...

    def size(self, content_hash: str) -> int:
        """How many bytes are stored under ``content_hash`` (without reading them);
        :class:`ContentNotFoundError` if there are none."""
        ...

    def get_within(self, content_hash: str, max_bytes: int) -> Bounded:
        """The size of the content stored under ``content_hash``, and its verified bytes if there are at most
        ``max_bytes`` (else None, and they are not read): what ingest reads, in one request where the store
        answers size and bytes together (S3's GET); :class:`ContentNotFoundError` if there is none."""
        ...

    def put_file(self, path: Path) -> Stored:
        """Store the content of the file ``path`` (idempotent) and return its hash and size, streamed: memory
        stays bounded whatever the file's size. What is returned always names the bytes stored. A file that
        changes meanwhile is stored as it was read where one pass reads, hashes and stores it (the local folder;
        S3 below ``multipart_threshold_mb``), and refused with a :class:`PermanentError` where it is hashed first
        and read again to upload (S3 above it)."""
        ...

    def copy_to(self, content_hash: str, out: BinaryIO) -> int:
        """Write the content stored under ``content_hash`` to ``out``, streamed and verified against the hash
        on the way; return its size. On an error ``out`` may hold part of it: discard what was written."""
        ...


class LocalContentStore:
    """A CAS on a local (or shared) filesystem: ``<root>/<first 2 hex>/<remaining 62 hex>``.

    Hashes are validated before they become paths, so no hash can escape ``root``. Writes go to a temporary
    file in the target folder and are renamed into place, so readers never see a partial file and two
    writers of the same content both succeed.
    """

    def __init__(self, root: Path) -> None:
        self._root = root

    @property
    def root(self) -> Path:
        return self._root

    def path_for(self, content_hash: str) -> Path:
        """The file that holds ``content_hash`` (which need not exist). Raises
        :class:`~shardfuse.pipeline.core.errors.InvalidEventError` for a malformed hash."""
        digest = hex_digest(content_hash)
        return self._root / digest[:2] / digest[2:]

    def put(self, data: bytes) -> str:
        """Store ``data`` and return its hash; storing the same bytes again is a no-op."""
        name = hash_content(data)
        target = self.path_for(name)
        with self._filesystem("write", name):
            if not target.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(target, data, tmp_prefix=".tmp-")
        return name

    def get(self, content_hash: str) -> bytes:
        """The bytes stored under ``content_hash``, verified against the hash."""
        path = self.path_for(content_hash)
        with self._filesystem("read", content_hash, reading=True):
            data = path.read_bytes()
        actual = hash_content(data)
        if actual != content_hash:
            raise PermanentError(
                f"corrupt CAS file {path}: its content hashes to {actual}, not {content_hash}; "
                "delete the file and publish the content again"
            )
        return data

    def exists(self, content_hash: str) -> bool:
        """Whether a file for ``content_hash`` exists (its content is not re-verified)."""
        path = self.path_for(content_hash)
        with self._filesystem("look up", content_hash):
            return path.is_file()

    def size(self, content_hash: str) -> int:
        """The size of the file for ``content_hash``, from the filesystem (the content is not read)."""
        path = self.path_for(content_hash)
        with self._filesystem("stat", content_hash, reading=True):
            return path.stat().st_size

    def get_within(self, content_hash: str, max_bytes: int) -> Bounded:
        """The file's size from the filesystem, then its bytes if they are within ``max_bytes``."""
        return _within(self, content_hash, max_bytes)

    def put_file(self, path: Path) -> Stored:
        """Store the file ``path``. It is hashed first: content held already is not written again (as
        :meth:`put`: republishing a tree is mostly that, and a copy costs a write and two syncs). Otherwise it
        is copied (and hashed again in the same pass) to a temporary file under ``root``, then renamed into
        place under the copy's hash (the file may have changed since it was hashed)."""
        held = hashed_file(path)  # the file's own OSError, as open() below raises it
        with self._filesystem("look up", held.content_hash):
            if self.path_for(held.content_hash).is_file():
                return held
        with open(path, "rb") as source, self._filesystem("write", str(path)):
            self._root.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(prefix=".tmp-", suffix=".tmp", dir=self._root)
            try:
                os.fchmod(fd, 0o644)  # as atomic_write_bytes: readable by workers running as another user
                with os.fdopen(fd, "wb") as out:
                    name, size = copy_hashing(read_chunks(source), out)
                    out.flush()
                    os.fsync(out.fileno())
                target = self.path_for(name)
                if target.is_file():
                    return Stored(name, size)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp_name, target)
                fsync_dir(target.parent)
                return Stored(name, size)
            finally:
                Path(tmp_name).unlink(missing_ok=True)

    def copy_to(self, content_hash: str, out: BinaryIO) -> int:
        """Copy the file of ``content_hash`` to ``out`` in chunks, verifying the hash."""
        path = self.path_for(content_hash)
        with self._filesystem("read", content_hash, reading=True), open(path, "rb") as source:
            return copy_verified(read_chunks(source), out, content_hash=content_hash, where=f"file {path}")

    @contextmanager
    def _filesystem(self, action: str, content_hash: str, *, reading: bool = False) -> Iterator[None]:
        """The filesystem's errors as ours: a missing file, when ``reading``, is content the CAS does not
        hold; anything else (a missing folder while writing included) is the CAS being unavailable."""
        try:
            yield
        except FileNotFoundError as exc:
            if reading:
                raise ContentNotFoundError(_not_found(f"the CAS at {self._root}", content_hash)) from exc
            raise StoreUnavailableError(f"cannot {action} {content_hash} in the CAS at {self._root}: {exc}") from exc
        except OSError as exc:
            raise StoreUnavailableError(f"cannot {action} {content_hash} in the CAS at {self._root}: {exc}") from exc


class InMemoryContentStore:
    """A CAS in a dict, for unit tests."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}

    def put(self, data: bytes) -> str:
        """Store ``data`` and return its hash."""
        name = hash_content(data)
        self._blobs[name] = bytes(data)
        return name

    def get(self, content_hash: str) -> bytes:
        """The bytes stored under ``content_hash``."""
        hex_digest(content_hash)
        try:
            return self._blobs[content_hash]
        except KeyError as exc:
            raise ContentNotFoundError(_not_found("the in-memory CAS", content_hash)) from exc

    def exists(self, content_hash: str) -> bool:
        """Whether content is stored under ``content_hash``."""
        hex_digest(content_hash)
        return content_hash in self._blobs

    def size(self, content_hash: str) -> int:
        """How many bytes are stored under ``content_hash``."""
        hex_digest(content_hash)
        try:
            return len(self._blobs[content_hash])
        except KeyError as exc:
            raise ContentNotFoundError(_not_found("the in-memory CAS", content_hash)) from exc

    def get_within(self, content_hash: str, max_bytes: int) -> Bounded:
        """The size, then the bytes (through :meth:`get`) if they are within ``max_bytes``."""
        return _within(self, content_hash, max_bytes)

    def put_file(self, path: Path) -> Stored:
        """Store the content of the file ``path``."""
        data = path.read_bytes()
        return Stored(self.put(data), len(data))

    def copy_to(self, content_hash: str, out: BinaryIO) -> int:
        """Write the content of ``content_hash`` to ``out``."""
        data = self.get(content_hash)
        return copy_verified([data], out, content_hash=content_hash, where="in memory")


def _within(store: ContentStore, content_hash: str, max_bytes: int) -> Bounded:
    """``get_within`` from ``size`` and ``get``: for stores where asking the size costs no request."""
    size = store.size(content_hash)
    return Bounded(size, None if size > max_bytes else store.get(content_hash))


def _not_found(where: str, content_hash: str) -> str:
    return (f"{where} holds no content {content_hash}: put the content in the CAS before publishing its event "
            "(the publisher does), then retry this dead letter (`shardfuse deadletters retry ID`)")
