"""Streaming content through the CAS in bounded memory: hashing a file, copying with the hash checked on the way.

Every adapter's ``put_file`` and ``copy_to`` use these, so a 5 GB file costs a few MiB of memory whatever
the store, and content read back is verified against its name before a caller relies on it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, NamedTuple

from shardfuse.pipeline.core.errors import PermanentError

# Bytes read or written at a time.
CHUNK_BYTES = 1024 * 1024


class Stored(NamedTuple):
    """What a ``put_file`` stored: the content's CAS name and its size in bytes (the stored bytes', which
    a file that changed since anyone looked at it may no longer have)."""

    content_hash: str
    size: int


class Bounded(NamedTuple):
    """What a bounded read (``get_within``) found: the content's size, and its bytes if there were at most
    the limit's (None: over the limit, and not read)."""

    size: int
    data: bytes | None


def file_hash(path: Path) -> str:
    """The CAS name (``"sha256:<hex>"``) of the file ``path``, read in chunks."""
    return hashed_file(path).content_hash


def hashed_file(path: Path) -> Stored:
    """The CAS name and size of the bytes read from the file ``path``, in chunks."""
    with open(path, "rb") as source:
        name = "sha256:" + hashlib.file_digest(source, "sha256").hexdigest()
        return Stored(name, source.tell())  # at the end of what was read and hashed


def file_identity(path: Path) -> tuple[int, int, int]:
    """What changes when a file is rewritten (inode, size, modification time): compared before hashing a file
    and after uploading it, to catch a file that changed in between."""
    info = os.stat(path)
    return info.st_ino, info.st_size, info.st_mtime_ns


def read_chunks(source: BinaryIO) -> Iterable[bytes]:
    """``source`` in chunks of at most :data:`CHUNK_BYTES`."""
    while chunk := source.read(CHUNK_BYTES):
        yield chunk


def copy_hashing(chunks: Iterable[bytes], out: BinaryIO) -> tuple[str, int]:
    """Write ``chunks`` to ``out``; return their CAS name and their total size."""
    digest = hashlib.sha256()
    size = 0
    for chunk in chunks:
        digest.update(chunk)
        out.write(chunk)
        size += len(chunk)
    return "sha256:" + digest.hexdigest(), size


def copy_verified(chunks: Iterable[bytes], out: BinaryIO, *, content_hash: str, where: str) -> int:
    """Write ``chunks`` (the content stored as ``content_hash``) to ``out`` and return their size;
    :class:`PermanentError` if they do not hash to ``content_hash`` (``out`` then holds bytes to discard)."""
    actual, size = copy_hashing(chunks, out)
    if actual != content_hash:
        raise corrupt_content(where, content_hash=content_hash, actual=actual)
    return size


def corrupt_content(where: str, *, content_hash: str, actual: str) -> PermanentError:
    """The error for stored bytes that do not match their name (``where``: "file /path", "object s3://…")."""
    return PermanentError(f"corrupt CAS {where}: its content hashes to {actual}, not {content_hash}; "
                          "delete it and publish the content again")
