"""DDL for one shard's schema and the shared tables, with identifiers composed by ``psycopg.sql``."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.index.store import catalog
from shardfuse.pipeline.index.store.change_log import CHANGE_COLUMN_DDL, CHANGE_INDEX, CHANGE_INDEX_DDL
from shardfuse.pipeline.index.store.grep_store import ensure_grep_table
from shardfuse.pipeline.index.store.lexical_publication import LEXICAL_DDL, LEXICAL_STORAGE_DDL
from shardfuse.pipeline.index.store.vector_index import BuildSettings, create_index_sql, index_state_ddl, is_deferred
from shardfuse.pipeline.index.store.vector_types import VectorType, choose, column_type

SHARED_SCHEMA = "shardfuse"
# Any constant works; it only has to be the same in every process that creates schemas.
_DDL_LOCK_KEY = 0x5348_4652_4455_5345

_SHARD_DDL = """
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.documents (
    zone         text        NOT NULL,
    path         text        NOT NULL,
    seq          bigint      NOT NULL,
    status       text        NOT NULL,
    content_hash text,
    event_id     text,
    size         bigint,
    mime         text,
    reason       text,
    chunk_count  integer     NOT NULL DEFAULT 0,
    token_count  integer     NOT NULL DEFAULT 0,
    line_count   integer     NOT NULL DEFAULT 0,
    metadata     jsonb,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (zone, path)
);
CREATE TABLE IF NOT EXISTS {schema}.chunks (
    chunk_id    text    PRIMARY KEY,
    zone        text    NOT NULL,
    path        text    NOT NULL,
    seq         bigint  NOT NULL,
    ordinal     integer NOT NULL,
    text        text    NOT NULL,
    start_char  integer NOT NULL,
    end_char    integer NOT NULL,
    start_line  integer NOT NULL,
    end_line    integer NOT NULL,
    token_count integer NOT NULL,
    chunk_hash  text    NOT NULL,
    metadata    jsonb,
    symbols     jsonb,
    embedding   {vector_type}({dimensions}) NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_zone_path ON {schema}.chunks (zone, path);
CREATE INDEX IF NOT EXISTS documents_status ON {schema}.documents (status) WHERE status <> 'indexed';
-- Per zone, the embedding models its writes fill (pipeline/index/store/embedding_columns.py); none: the default.
CREATE TABLE IF NOT EXISTS {schema}.fill_models (
    zone        text        PRIMARY KEY,
    models      text[]      NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
"""

# Columns added to ``chunks`` after shards existed, each with the statement that adds it. ALTER TABLE takes
# an ACCESS EXCLUSIVE lock even when IF NOT EXISTS makes it a no-op, and this runs at every worker start:
# it would queue every reader of the shard behind a running BM25 snapshot. So it runs only when the
# catalog lacks the column (IF NOT EXISTS stays as a second guard).
_ADDED_CHUNK_COLUMNS: dict[str, str] = {
    # {"symbols": [...], "primary": ..., "role": ...} for code chunks (shardfuse.pipeline.ingest.symbols), NULL
    # otherwise.
    "symbols": "ALTER TABLE {schema}.chunks ADD COLUMN IF NOT EXISTS symbols jsonb",
    # The code's language, the outline position, and the situating context (shardfuse.pipeline.ingest.context).
    "language": "ALTER TABLE {schema}.chunks ADD COLUMN IF NOT EXISTS language text",
    "heading_path": "ALTER TABLE {schema}.chunks ADD COLUMN IF NOT EXISTS heading_path text[] NOT NULL DEFAULT '{{}}'",
    "context": "ALTER TABLE {schema}.chunks ADD COLUMN IF NOT EXISTS context text NOT NULL DEFAULT ''",
    "context_source": "ALTER TABLE {schema}.chunks ADD COLUMN IF NOT EXISTS context_source text",
}
# Columns added to ``documents`` after shards existed.
_ADDED_DOCUMENT_COLUMNS: dict[str, str] = {
    # Chunks the entropy filter dropped, by reason: {"duplicate": 2, ...}; NULL when none.
    "dropped": "ALTER TABLE {schema}.documents ADD COLUMN IF NOT EXISTS dropped jsonb",
    # The highest lease fencing token a write of the document carried (shardfuse.pipeline.coordination.leases); older
    # ones are refused.
    "fence": "ALTER TABLE {schema}.documents ADD COLUMN IF NOT EXISTS fence bigint NOT NULL DEFAULT 0",
    # The transaction that last wrote the document: what the BM25 update asks "changed since" of
    # (shardfuse.pipeline.index.store.change_log); NULL for rows written before it existed.
    "change_xid": CHANGE_COLUMN_DDL,
}
# Indexes on columns added since, each created only when the catalog lacks it (CREATE INDEX takes a lock
# that queues writers even when IF NOT EXISTS finds it there).
_ADDED_INDEXES: dict[str, str] = {CHANGE_INDEX: CHANGE_INDEX_DDL}

_SHARED_DDL = """
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.deadletters (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task          text        NOT NULL,
    payload       jsonb       NOT NULL,
    zone          text,
    path          text,
    error_class   text        NOT NULL,
    reason        text        NOT NULL,
    attempts      integer     NOT NULL,
    first_failed  timestamptz NOT NULL DEFAULT now(),
    last_failed   timestamptz NOT NULL DEFAULT now()
);
-- Chunk embeddings by content, shared by every shard (pipeline/index/store/embedding_cache.py). The vector has no
-- fixed dimension so that several models coexist; dimensions is part of the key instead.
CREATE TABLE IF NOT EXISTS {schema}.embedding_cache (
    provider    text        NOT NULL,
    model       text        NOT NULL,
    dimensions  integer     NOT NULL,
    chunk_hash  text        NOT NULL,
    embedding   vector      NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, model, dimensions, chunk_hash)
);
-- Per zone, the embedding model its queries use, and a reindex to another model in progress
-- (pipeline/index/store/zone_models.py).
CREATE TABLE IF NOT EXISTS {schema}.zone_models (
    zone         text        PRIMARY KEY,
    active       text        NOT NULL,
    target       text,
    previous     text,
    started_at   timestamptz,
    switched_at  timestamptz
);
-- LLM chunk contexts by document and chunk (pipeline/index/store/context_cache.py).
CREATE TABLE IF NOT EXISTS {schema}.context_cache (
    doc_hash        text        NOT NULL,
    chunk_hash      text        NOT NULL,
    model           text        NOT NULL,
    prompt_version  text        NOT NULL,
    context         text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (doc_hash, chunk_hash, model, prompt_version)
);
"""


def shard_schema(shard: int) -> str:
    return f"shard_{shard}"


def ensure_shard_schema(conn: psycopg.Connection[object], shard: int, *, dimensions: int,
                        build: BuildSettings | None = None) -> VectorType:
    """Create the shard's schema if missing, and refuse to run against one built for other vectors; the
    pgvector type of its embeddings (:mod:`shardfuse.pipeline.index.store.vector_types`).

    Workers start concurrently; ``CREATE ... IF NOT EXISTS`` is not safe against itself, so creation is
    serialised by a transaction-scoped advisory lock. A shard created by an older release gets the
    ``chunks`` columns added since (existing rows read NULL there).
    """
    schema = shard_schema(shard)
    build = build or BuildSettings()
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK_KEY,))
        existing = _embedding_dimensions(conn, schema)
        if existing is not None and existing != dimensions:
            raise ConfigurationError(
                f"shard {shard} stores {existing}-dimensional embeddings but the embedder makes {dimensions}: "
                f"use an embedder with {existing} dimensions or index into a new database"
            )
        vector_type = column_type(conn, schema, "embedding") or choose(conn, build.storage, dimensions=dimensions)
        if build.storage not in ("auto", vector_type):
            raise ConfigurationError(
                f"shard {shard} stores its embeddings as {vector_type} but vector_index.storage is {build.storage!r}: "
                f"a shard keeps the type it was created with; set storage to 'auto' or index into a new database"
            )
        ddl = sql.SQL(_SHARD_DDL).format(schema=sql.Identifier(schema), dimensions=sql.Literal(dimensions),
                                         vector_type=sql.SQL(vector_type))
        conn.execute(ddl)
        _ensure_lexical_tables(conn, schema)
        ensure_grep_table(conn, schema)
        for table, added in (("chunks", _ADDED_CHUNK_COLUMNS), ("documents", _ADDED_DOCUMENT_COLUMNS)):
            for column, statement in added.items():
                if column_typmod(conn, schema, column, table=table) is None:
                    conn.execute(sql.SQL(statement).format(schema=sql.Identifier(schema)))
        for index, statement in _ADDED_INDEXES.items():
            if conn.execute("SELECT to_regclass(%s)", (f'"{schema}"."{index}"',)).fetchone() == (None,):
                conn.execute(sql.SQL(statement).format(schema=sql.Identifier(schema)))
        conn.execute(index_state_ddl(schema))
        # The HNSW index, unless a bulk load deferred it: then the maintenance task builds it, not start-up.
        if not is_deferred(conn, schema):
            conn.execute(create_index_sql(schema, build, concurrently=False, vector_type=vector_type))
    return vector_type


def _ensure_lexical_tables(conn: psycopg.Connection[object], schema: str) -> None:
    """The tables the shard's BM25 index is published in (:mod:`.lexical_publication`), created with the shard or
    added to one created before them."""
    if conn.execute("SELECT to_regclass(%s)", (f'"{schema}"."lexical_files"',)).fetchone() != (None,):
        return
    conn.execute(sql.SQL(LEXICAL_DDL).format(schema=sql.Identifier(schema)))
    conn.execute(sql.SQL(LEXICAL_STORAGE_DDL).format(schema=sql.Identifier(schema)))


def ensure_shared_schema(conn: psycopg.Connection[object]) -> None:
    """Create the shared tables (dead letters, the embedding cache) if missing."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK_KEY,))
        conn.execute(sql.SQL(_SHARED_DDL).format(schema=sql.Identifier(SHARED_SCHEMA)))


def _embedding_dimensions(conn: psycopg.Connection[object], schema: str) -> int | None:
    return column_typmod(conn, schema, "embedding", table="chunks")


def column_typmod(conn: psycopg.Connection[Any], schema: str, column: str, *, table: str) -> int | None:
    """The type modifier of a column of one of the shard's tables (a vector's dimensions; -1 for types
    without one), or None when the table or the column does not exist."""
    found = catalog.column(conn, schema, table, column)
    return None if found is None else found.typmod
