"""Durable file operations shared by the CAS and the BM25 indexes: fsync, atomic replacement, a lock.

A manifest must never point at a generation whose bytes are still in the page cache only, and a reader
must never see a half-written manifest. Both need the same few calls, in the same order, collected here.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (a rename or a new file) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """Flush every regular file directly inside ``path``, then the directory itself."""
    for entry in path.iterdir():
        if entry.is_file():
            fd = os.open(entry, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fsync_dir(path)


def atomic_write_bytes(path: Path, data: bytes, *, tmp_prefix: str) -> None:
    """Replace ``path`` with ``data`` so that readers see either the old or the new bytes, never a mix.

    Writes a uniquely named temporary file in the same directory (``os.replace`` is atomic only within one
    filesystem), fsyncs it, renames it over ``path`` and fsyncs the directory so the rename survives a crash.
    """
    fd, tmp_name = tempfile.mkstemp(prefix=tmp_prefix, suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates 0600; query workers may run as another user on the shared filesystem.
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


@contextmanager
def try_exclusive_lock(path: Path) -> Iterator[bool]:
    """Take an exclusive ``flock`` on ``path`` if nobody holds it; yield whether it was taken."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
        else:
            yield True
    finally:
        os.close(fd)


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the ``with`` block.

    ``flock`` locks are released by the kernel when the process dies, so a crashed builder never leaves a
    shard locked. They serialise processes and threads alike, because each call opens its own descriptor.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        # Closing the descriptor releases the lock.
        os.close(fd)
