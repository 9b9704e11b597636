"""Pure row builders for the binary COPY into ``chunks``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from psycopg.types.json import Jsonb

from shardfuse.pipeline.core.documents import chunk_id
from shardfuse.pipeline.index.store.changes import DocumentChange

CHUNK_COLUMNS: tuple[str, ...] = (
    "chunk_id", "zone", "path", "seq", "ordinal", "text", "start_char", "end_char",
    "start_line", "end_line", "token_count", "chunk_hash", "metadata", "symbols", "embedding",
    "language", "heading_path", "context", "context_source",
)  # fmt: skip
# PostgreSQL types in column order: binary COPY needs them spelled out.
CHUNK_TYPES: tuple[str, ...] = (
    "text", "text", "text", "int8", "int4", "text", "int4", "int4",
    "int4", "int4", "int4", "text", "jsonb", "jsonb", "vector",
    "text", "text[]", "text", "text",
)  # fmt: skip
_EMBEDDING = CHUNK_COLUMNS.index("embedding")


def chunk_types(vector_type: str) -> list[str]:
    """:data:`CHUNK_TYPES` for a shard whose embeddings are of ``vector_type`` (vector or halfvec)."""
    return [vector_type if i == _EMBEDDING else t for i, t in enumerate(CHUNK_TYPES)]


def _as_is(vector: Any) -> Any:
    return vector


def chunk_rows(change: DocumentChange, models: Sequence[str] = (), *,
               vector: Callable[[Any], Any] = _as_is) -> Iterator[tuple[Any, ...]]:
    """One COPY row per chunk of an indexed change: :data:`CHUNK_COLUMNS`, then one vector per model of
    ``models`` (other models' columns, :mod:`shardfuse.pipeline.index.store.embedding_columns`). A model the change has
    no
    vectors of (the default one, for a zone that left it) is NULL. ``vector`` turns each float32 array into
    what the shard's column type takes (:func:`shardfuse.pipeline.index.store.vector_types.copy_value`)."""
    event = change.event
    metadata = Jsonb(event.metadata) if event.metadata else None
    count = len(change.chunks)
    default = change.embeddings if change.embeddings is not None else [None] * count
    others = [change.model_embeddings.get(model, [None] * count) for model in models]
    for i, (chunk, embedding) in enumerate(zip(change.chunks, default, strict=True)):
        symbols = chunk.symbols.to_json()
        yield (
            chunk_id(event.zone, event.path, event.seq, chunk.ordinal),
            event.zone,
            event.path,
            event.seq,
            chunk.ordinal,
            # PostgreSQL text cannot hold NUL; decode rejects NUL-laden content, this is the last guard.
            chunk.text.replace("\x00", "\ufffd"),
            chunk.start_char,
            chunk.end_char,
            chunk.start_line,
            chunk.end_line,
            chunk.token_count,
            chunk.chunk_hash,
            metadata,
            None if symbols is None else Jsonb(symbols),  # NULL: not code, or code that defines nothing
            vector(embedding),
            chunk.language,
            list(chunk.heading_path),
            chunk.context.replace("\x00", "\ufffd"),
            None if chunk.context_source is None else chunk.context_source.value,
            *(vector(vectors[i]) for vectors in others),
        )
