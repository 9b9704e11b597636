"""Reading a shard's chunks for BM25: every chunk (a full build) or those of a few documents (a delta).

These read the shard's ``chunks`` table through the :class:`~pipeline.store.ShardStore`'s pool. They
differ from ``ShardStore.iter_lexical_rows`` in returning each chunk's document path, which a generation
needs to let a delta mask a rewritten document's rows. (They belong in ``ShardStore``; kept here while
that module has another owner.) Both index what was embedded: the situating context, then the chunk.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from psycopg import sql

from pipeline.store.connections import pooled_connection
from pipeline.store.schema import shard_schema

_TEXT = "CASE WHEN context = '' THEN text ELSE context || E'\\n\\n' || text END"


class LexicalRow(NamedTuple):
    chunk_id: str
    zone: str
    path: str
    text: str


class Rows(NamedTuple):
    """Column-wise rows, as the builders take them."""

    chunk_ids: list[str]
    zones: list[str]
    paths: list[str]
    texts: list[str]

    @classmethod
    def of(cls, rows: Iterable[tuple[str, str, str, str]]) -> Rows:
        out = cls([], [], [], [])
        for chunk_id, zone, path, text in rows:
            out.chunk_ids.append(chunk_id)
            out.zones.append(zone)
            out.paths.append(path)
            out.texts.append(text)
        return out


def iter_shard_rows(store: Any, *, batch_size: int = 5000) -> Iterator[LexicalRow]:
    """Every chunk of ``store``'s shard, from one snapshot, streamed by a server-side cursor."""
    query = sql.SQL("SELECT chunk_id, zone, path, " + _TEXT + " FROM {s}.chunks ORDER BY chunk_id").format(
        s=sql.Identifier(shard_schema(store.shard))
    )
    with (
        pooled_connection(store.pool, what=f"shard {store.shard}") as conn,
        conn.transaction(),
        conn.cursor(name=f"bm25_rows_{store.shard}") as cur,
    ):
        cur.itersize = batch_size
        cur.execute(query)
        for row in cur:
            yield LexicalRow(*row)


def document_rows(store: Any, keys: Iterable[tuple[str, str]]) -> Rows:
    """The current chunks of the documents ``keys`` (``(zone, path)``; absent ones have none)."""
    pairs = sorted(set(keys))
    if not pairs:
        return Rows([], [], [], [])
    query = sql.SQL(
        "SELECT c.chunk_id, c.zone, c.path, "
        "CASE WHEN c.context = '' THEN c.text ELSE c.context || E'\\n\\n' || c.text END"
        " FROM unnest(%s::text[], %s::text[]) AS t(z, p) JOIN {s}.chunks c ON c.zone = t.z AND c.path = t.p"
        " ORDER BY c.chunk_id"
    ).format(s=sql.Identifier(shard_schema(store.shard)))
    with pooled_connection(store.pool, what=f"shard {store.shard}") as conn:
        rows = conn.execute(query, ([z for z, _ in pairs], [p for _, p in pairs])).fetchall()
    return Rows.of(rows)
