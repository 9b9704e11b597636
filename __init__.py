"""shardfuse: a hybrid (BM25 + pgvector) search index kept in step with a content-addressed store.

The public API is what this module exports::

    from shardfuse import SearchClient, connect_publisher, load_settings

    settings = load_settings("config/local.toml")
    with connect_publisher(settings) as publisher:
        publisher.write(zone="docs", path="guide.md", data=b"# Guide ...")
    answer = SearchClient(settings).search(query="how do I start", zone="docs", k=5)

Everything else is reached through the subpackages: ``shardfuse.pipeline`` (the indexing domain),
``shardfuse.query`` (the query domain) and ``shardfuse.workers`` (Celery, the CLI and the embedded stack).
The names below are imported on first use, so ``import shardfuse.pipeline`` never loads Celery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardfuse.pipeline.admin.publisher import Publisher, Write
    from shardfuse.pipeline.config.settings import Settings, load_settings
    from shardfuse.pipeline.core.errors import (
        InvalidQueryError,
        PermanentError,
        RemoteSearchError,
        ShardfuseError,
        TransientError,
    )
    from shardfuse.pipeline.core.events import WriteEvent
    from shardfuse.workers.client import SearchClient, connect_publisher

_EXPORTS = {
    "Publisher": "shardfuse.pipeline.admin.publisher",
    "Write": "shardfuse.pipeline.admin.publisher",
    "Settings": "shardfuse.pipeline.config.settings",
    "load_settings": "shardfuse.pipeline.config.settings",
    "ShardfuseError": "shardfuse.pipeline.core.errors",
    "TransientError": "shardfuse.pipeline.core.errors",
    "PermanentError": "shardfuse.pipeline.core.errors",
    "InvalidQueryError": "shardfuse.pipeline.core.errors",
    "RemoteSearchError": "shardfuse.pipeline.core.errors",
    "WriteEvent": "shardfuse.pipeline.core.events",
    "SearchClient": "shardfuse.workers.client",
    "connect_publisher": "shardfuse.workers.client",
}
__all__ = [
    "InvalidQueryError", "PermanentError", "Publisher", "RemoteSearchError", "SearchClient", "Settings",
    "ShardfuseError", "TransientError", "Write", "WriteEvent", "connect_publisher", "load_settings",
]


def __getattr__(name: str) -> Any:
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'shardfuse' has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
