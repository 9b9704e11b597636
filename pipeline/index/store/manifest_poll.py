"""The published BM25 manifests of every shard in one database, read in one statement.

A query node's follower (:mod:`shardfuse.pipeline.index.lexical.follower`) looks for a newly published
generation or delta every ``bm25.follow_interval_s`` (0.1 s). Read one shard at a time, a round cost a query
process ~0.17 ms of CPU a shard, most of it psycopg's round trip and parsing the same JSON again (session 26);
here a database's shards take one statement, and a manifest whose text has not changed is not parsed again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import sql
from psycopg_pool import ConnectionPool

from shardfuse.pipeline.index.lexical.manifest import ShardManifest
from shardfuse.pipeline.index.store.connections import reading_connection
from shardfuse.pipeline.index.store.lexical_publication import parse_published
from shardfuse.pipeline.index.store.schema import shard_schema


class PublishedManifests:
    """The manifests published for ``shards``, all of them in the database of ``pool``."""

    def __init__(self, pool: ConnectionPool[Any], shards: Sequence[int]) -> None:
        self._pool = pool
        self.shards = tuple(shards)
        self._statement = sql.SQL(" UNION ALL ").join(
            sql.SQL("SELECT {n}::int, manifest FROM {s}.lexical_manifest").format(
                n=sql.Literal(shard), s=sql.Identifier(shard_schema(shard)))
            for shard in self.shards)
        self._what = f"the published BM25 manifests of shards {', '.join(map(str, self.shards))}"
        self._parsed: dict[int, tuple[str, ShardManifest]] = {}

    def read(self) -> dict[int, ShardManifest | None]:
        """Every shard's published manifest (None: nothing published yet). Raises our errors: a shard whose
        schema is missing fails the whole statement (:class:`SchemaMissingError`), a damaged manifest
        :class:`PermanentError`, PostgreSQL out of reach :class:`StoreUnavailableError`."""
        with reading_connection(self._pool, what=self._what) as conn:
            rows = conn.execute(self._statement).fetchall()
        found: dict[int, ShardManifest | None] = dict.fromkeys(self.shards)
        for shard, text in rows:
            last = self._parsed.get(shard)
            if last is None or last[0] != text:
                last = self._parsed[shard] = (text, parse_published(text, shard))
            found[shard] = last[1]
        return found
