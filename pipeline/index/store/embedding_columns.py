"""Which embedding columns a shard's writes must fill, per zone: the write side of reindexing a zone to a new
embedding model (``pipeline/admin/reindex.py``).

Every model has a column of its own in ``chunks``: ``embedding`` for the default model ([embedder]),
``embedding_<name>`` for ``[embedders.<name>]``. A zone's writes fill the columns of the models listed for
it in the shard's ``fill_models`` table, ``{default}`` when the zone has no row. A reindex adds the new model
to that list, backfills the zone's existing chunks, and, once the zone has been switched over and the old
model is no longer wanted, removes the old one.

The list must never change under a write that is about to commit, or a chunk could be written without a
column the backfill already passed. So every write transaction holds the shard's *models lock* shared
(``pg_advisory_xact_lock_shared``) while it reads the list and writes its rows, and a change of the list
takes it exclusively: the change waits for the writes in flight, and every write after it sees the new
list. A write that lacks vectors for a model now listed is refused (``ApplyOutcome.missing_models``) and
retried with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql

from shardfuse.pipeline.config.settings import DEFAULT_MODEL, MODEL_NAME
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.index.store.schema import column_typmod
from shardfuse.pipeline.index.store.vector_types import shard_vector_type

# Any constant works; it only has to be the same in every process (the shard number is the second key).
_MODELS_LOCK_KEY = 0x5346_4D44


def column_for(model: str) -> str:
    """The ``chunks`` column holding ``model``'s vectors."""
    if model == DEFAULT_MODEL:
        return "embedding"
    if not MODEL_NAME.fullmatch(model):
        raise ConfigurationError(f"{model!r} is not a model name (lower-case letters, digits, _)")
    return f"embedding_{model}"


def index_for(model: str) -> str:
    """The HNSW index over ``model``'s column."""
    return "chunks_embedding_hnsw" if model == DEFAULT_MODEL else f"chunks_{column_for(model)}_hnsw"


def lock_shared(cur: psycopg.Cursor[Any], shard: int) -> None:
    """Hold the shard's models lock shared until the transaction ends (every write does)."""
    cur.execute("SELECT pg_advisory_xact_lock_shared(%s, %s)", (_MODELS_LOCK_KEY, shard))


def required_models(cur: psycopg.Cursor[Any], schema: sql.Identifier,
                    zones: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The models each of ``zones`` must be written with (zones without a row: the default model)."""
    wanted = sorted(set(zones))
    cur.execute(sql.SQL("SELECT zone, models FROM {s}.fill_models WHERE zone = ANY(%s)").format(s=schema), (wanted,))
    listed = {zone: tuple(models) for zone, models in cur.fetchall()}
    return {zone: listed.get(zone, (DEFAULT_MODEL,)) for zone in wanted}


def fill_models(conn: psycopg.Connection[Any], schema: sql.Identifier) -> dict[str, tuple[str, ...]]:
    """Every zone with a list of its own (a reindexed zone); the others use the default model."""
    rows = conn.execute(sql.SQL("SELECT zone, models FROM {s}.fill_models").format(s=schema)).fetchall()
    return {zone: tuple(models) for zone, models in rows}


def column_dimensions(conn: psycopg.Connection[Any], schema: str, model: str) -> int | None:
    """The dimensions of ``model``'s column in the shard, or None when the column does not exist."""
    return column_typmod(conn, schema, column_for(model), table="chunks")


def set_fill_models(conn: psycopg.Connection[Any], schema: str, shard: int, *, zone: str,
                    models: Sequence[str], dimensions: dict[str, int]) -> None:
    """Make ``zone``'s writes fill exactly ``models``, adding the columns that are missing (``dimensions``
    per model). Waits for the shard's writes in flight (the models lock, exclusively)."""
    if not models:
        raise ConfigurationError("a zone's writes must fill at least one embedding column")
    ident = sql.Identifier(schema)
    with conn.transaction():
        conn.execute("SELECT set_config('lock_timeout', '30s', true)")
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_MODELS_LOCK_KEY, shard))
        vector_type = shard_vector_type(conn, schema)  # every model's column has the shard's type
        for model in models:
            existing = column_dimensions(conn, schema, model)
            if existing is None:
                conn.execute(sql.SQL("ALTER TABLE {s}.chunks ADD COLUMN IF NOT EXISTS {c} {t}({d})").format(
                    s=ident, c=sql.Identifier(column_for(model)), t=sql.SQL(vector_type),
                    d=sql.Literal(dimensions[model])))
            elif existing != dimensions[model]:
                raise ConfigurationError(
                    f"shard {shard} holds {existing}-dimensional vectors for model {model!r} but it is configured "
                    f"with {dimensions[model]}: give the new configuration a new model name")
        if DEFAULT_MODEL not in models:
            # The default column was NOT NULL before any zone left the default model.
            conn.execute(sql.SQL("ALTER TABLE {s}.chunks ALTER COLUMN embedding DROP NOT NULL").format(s=ident))
        conn.execute(
            sql.SQL("INSERT INTO {s}.fill_models (zone, models) VALUES (%s, %s) ON CONFLICT (zone) DO UPDATE "
                    "SET models = EXCLUDED.models, updated_at = now()").format(s=ident),
            (zone, list(models)),
        )


def missing_rows(conn: psycopg.Connection[Any], schema: sql.Identifier, *, zone: str, model: str,
                 after: str, limit: int) -> list[tuple[str, str, str]]:
    """Up to ``limit`` chunks of ``zone`` (id order, after ``after``) without a ``model`` vector: their id,
    content hash and embedded text (the context, then the chunk, as the write path embeds them)."""
    return conn.execute(
        sql.SQL(
            "SELECT chunk_id, chunk_hash, CASE WHEN context = '' THEN text ELSE context || E'\\n\\n' || text END "
            "FROM {s}.chunks WHERE zone = %s AND {c} IS NULL AND chunk_id > %s ORDER BY chunk_id LIMIT %s"
        ).format(s=schema, c=sql.Identifier(column_for(model))),
        (zone, after, limit),
    ).fetchall()


def write_vectors(conn: psycopg.Connection[Any], schema: sql.Identifier, *, model: str, chunk_ids: Sequence[str],
                  vectors: npt.NDArray[np.float32]) -> int:
    """Set ``model``'s vector of the given chunks where it is still missing; rows updated. A chunk replaced
    or deleted meanwhile is simply not there (its successor was written with every listed model). The
    vectors travel by binary COPY into a temporary table, then one UPDATE joins them in."""
    if not chunk_ids:
        return 0
    column = sql.Identifier(column_for(model))
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("CREATE TEMP TABLE reindex_vectors (id text, vec vector) ON COMMIT DROP")
        with cur.copy("COPY reindex_vectors (id, vec) FROM STDIN WITH (FORMAT BINARY)") as copy:
            copy.set_types(["text", "vector"])
            for chunk_id, vector in zip(chunk_ids, vectors, strict=True):
                copy.write_row((chunk_id, vector))
        cur.execute(
            sql.SQL("UPDATE {s}.chunks c SET {col} = v.vec FROM reindex_vectors v "
                    "WHERE c.chunk_id = v.id AND c.{col} IS NULL").format(s=schema, col=column))
        return cur.rowcount


def count_missing(conn: psycopg.Connection[Any], schema: sql.Identifier, *, zone: str, model: str) -> tuple[int, int]:
    """``zone``'s chunks in the shard, and how many of them lack a ``model`` vector."""
    row = conn.execute(
        sql.SQL("SELECT count(*), count(*) FILTER (WHERE {c} IS NULL) FROM {s}.chunks WHERE zone = %s").format(
            s=schema, c=sql.Identifier(column_for(model))),
        (zone,),
    ).fetchone()
    return (0, 0) if row is None else (int(row[0]), int(row[1]))

