"""The LLM context cache: ``(doc_hash, chunk_hash, model, prompt_version) → context`` in PostgreSQL
(table ``shardfuse.context_cache``, shared by every shard).

A document re-published unchanged, or re-indexed by ``shardfuse backfill-context``, asks the model only
for the chunks it has no context for. Like the embedding cache, rows are inserted in key order with
``ON CONFLICT DO NOTHING`` so concurrent writers never deadlock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psycopg import sql
from psycopg_pool import ConnectionPool

from shardfuse.pipeline.index.store.connections import pooled_connection
from shardfuse.pipeline.index.store.schema import SHARED_SCHEMA

_TABLE = sql.Identifier(SHARED_SCHEMA, "context_cache")


class PostgresContextCache:
    def __init__(self, pool: ConnectionPool[Any]) -> None:
        self.pool = pool

    def get_many(
        self, keys: Sequence[tuple[str, str]], *, model: str, prompt_version: str
    ) -> dict[tuple[str, str], str]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        query = sql.SQL(
            "SELECT c.doc_hash, c.chunk_hash, c.context FROM {t} c "
            "JOIN unnest(%s::text[], %s::text[]) AS k(d, h) ON c.doc_hash = k.d AND c.chunk_hash = k.h "
            "WHERE c.model = %s AND c.prompt_version = %s"
        ).format(t=_TABLE)
        with pooled_connection(self.pool, what="the context cache") as conn:
            rows = conn.execute(query, ([d for d, _ in wanted], [h for _, h in wanted], model, prompt_version))
            return {(d, h): context for d, h, context in rows.fetchall()}

    def put_many(self, items: Mapping[tuple[str, str], str], *, model: str, prompt_version: str) -> None:
        if not items:
            return
        ordered = sorted(items.items())
        insert = sql.SQL(
            "INSERT INTO {t} (doc_hash, chunk_hash, model, prompt_version, context) "
            "SELECT d, h, %s, %s, c FROM unnest(%s::text[], %s::text[], %s::text[]) AS k(d, h, c) "
            "ON CONFLICT DO NOTHING"
        ).format(t=_TABLE)
        params = (model, prompt_version, [d for (d, _), _ in ordered], [h for (_, h), _ in ordered],
                  [c.replace("\x00", "\ufffd") for _, c in ordered])
        with pooled_connection(self.pool, what="the context cache") as conn, conn.transaction():
            conn.execute(insert, params)
