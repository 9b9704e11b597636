"""Which pgvector type holds a shard's embeddings: ``halfvec`` where the server's pgvector has it, else ``vector``.

``halfvec`` (pgvector 0.7+) stores each dimension in 2 bytes instead of 4: half the table and half the HNSW
graph, so more of both stay in memory, and indexes up to 4,000 dimensions instead of 2,000. Cosine
similarity in half precision moves scores by ~1e-3, well below what separates neighbours.

The type is chosen once, when a shard's ``chunks`` table is created (``vector_index.storage``: ``auto``
picks ``halfvec`` when the server offers it), and read back from the catalog ever after: a shard created as
``vector`` stays ``vector`` after a server upgrade, and every column of a shard (other models' included) has
the shard's type. Reads need nothing: pgvector casts a ``vector`` parameter to ``halfvec`` implicitly, so
the same query (and its HNSW index scan) serves both. Binary ``COPY`` does not cast, so writes send
:class:`pgvector.HalfVector` values to a ``halfvec`` shard.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import psycopg
from pgvector import HalfVector

from shardfuse.pipeline.config.settings import VectorStorage
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.index.store import catalog

VectorType = Literal["vector", "halfvec"]
VECTOR: VectorType = "vector"
HALFVEC: VectorType = "halfvec"

HALFVEC_SINCE = (0, 7)
# The most dimensions an HNSW index takes, per type (pgvector's limits).
HNSW_MAX_DIMENSIONS: dict[VectorType, int] = {VECTOR: 2000, HALFVEC: 4000}


def pgvector_version(conn: psycopg.Connection[Any]) -> tuple[int, ...]:
    """The installed ``vector`` extension's version, e.g. ``(0, 6, 0)``."""
    row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    if row is None:
        raise ConfigurationError("the database has no vector extension: CREATE EXTENSION vector first")
    return tuple(int(part) for part in str(row[0]).split(".") if part.isdigit())


def choose(conn: psycopg.Connection[Any], storage: VectorStorage, *, dimensions: int) -> VectorType:
    """The type a new shard's embeddings get under ``storage``; a type the server cannot index is refused."""
    version = pgvector_version(conn)
    has_halfvec = version >= HALFVEC_SINCE
    if storage == HALFVEC and not has_halfvec:
        raise ConfigurationError(
            f"vector_index.storage is 'halfvec' but the server's pgvector is {_dotted(version)} (halfvec needs "
            f"{_dotted(HALFVEC_SINCE)}): upgrade the extension or set storage to 'auto' or 'vector'"
        )
    chosen: VectorType = HALFVEC if storage == HALFVEC or (storage == "auto" and has_halfvec) else VECTOR
    if dimensions > HNSW_MAX_DIMENSIONS[chosen]:
        raise ConfigurationError(
            f"pgvector indexes at most {HNSW_MAX_DIMENSIONS[chosen]} dimensions as {chosen}, and the embedder makes "
            f"{dimensions}" + ("" if chosen == HALFVEC else "; halfvec (pgvector 0.7+) takes up to 4000")
        )
    return chosen


def column_type(conn: psycopg.Connection[Any], schema: str, column: str, *, table: str = "chunks") -> VectorType | None:
    """The pgvector type of a column of one of the shard's tables; None when it does not exist."""
    found = catalog.column(conn, schema, table, column)
    if found is None:
        return None
    if found.type_name not in (VECTOR, HALFVEC):
        raise ConfigurationError(f"{schema}.{table}.{column} is of type {found.type_name}, not vector or halfvec")
    return HALFVEC if found.type_name == HALFVEC else VECTOR


def shard_vector_type(conn: psycopg.Connection[Any], schema: str, column: str = "embedding") -> VectorType:
    """The pgvector type of an embedding column of the shard's ``chunks``, which must exist."""
    found = column_type(conn, schema, column)
    if found is None:
        raise ConfigurationError(f"{schema}.chunks has no column {column}: the shard's schema was not created")
    return found


def cosine_opclass(vector_type: VectorType) -> str:
    """The HNSW operator class for cosine distance over ``vector_type``."""
    return f"{vector_type}_cosine_ops"


def copy_value(vector_type: VectorType) -> Callable[[Any], Any]:
    """What a binary ``COPY`` into a ``vector_type`` column is sent for a float32 array (None stays NULL)."""
    if vector_type == VECTOR:
        return lambda vector: vector
    return lambda vector: None if vector is None else HalfVector(np.asarray(vector, dtype=np.float16))


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))
