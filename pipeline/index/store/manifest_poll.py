"""The published BM25 manifests of every shard in one database, read in one statement.

A query node's follower (:mod:`shardfuse.pipeline.index.lexical.follower`) looks for a newly published
generation or delta every ``bm25.follow_interval_s`` (0.1 s). Read one shard at a time, a round cost a query
process ~0.17 ms of CPU a shard, most of it psycopg's round trip and parsing the same JSON again (session 26);
here a database's shards take one statement, and a manifest whose text has not changed is not parsed again.

A shard whose schema does not exist yet (a fresh stack, before a worker creates it) would fail the whole
statement, round after round. So the statement names only the shards whose manifest table exists: when it
fails for a missing table, the tables are looked up once and the statement rebuilt; the shards left out are
looked up again at most every ``recheck_s``. A shard left out is absent from :meth:`read`'s answer, and the
follower reads it alone, which reports its own error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from psycopg import sql
from psycopg_pool import ConnectionPool

from shardfuse.pipeline.index.lexical.manifest import ShardManifest
from shardfuse.pipeline.index.store.connections import MISSING_TABLE, reading_connection
from shardfuse.pipeline.index.store.lexical_publication import parse_published
from shardfuse.pipeline.index.store.schema import shard_schema

_EXISTING = "SELECT schemaname FROM pg_catalog.pg_tables WHERE tablename = 'lexical_manifest' AND schemaname = ANY(%s)"


class PublishedManifests:
    """The manifests published for ``shards``, all of them in the database of ``pool``."""

    def __init__(self, pool: ConnectionPool[Any], shards: Sequence[int], *, recheck_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._pool = pool
        self.shards = tuple(shards)
        self._what = f"the published BM25 manifests of shards {', '.join(map(str, self.shards))}"
        self._parsed: dict[int, tuple[str, ShardManifest]] = {}
        self._recheck_s, self._clock = recheck_s, clock
        self._recheck_at = 0.0
        self._joined: tuple[int, ...] = ()
        self._statement: sql.Composable | None = None
        self._join(self.shards)

    @property
    def left_out(self) -> tuple[int, ...]:
        """The shards the statement leaves out: their manifest table did not exist when last looked up."""
        return tuple(shard for shard in self.shards if shard not in self._joined)

    def read(self) -> dict[int, ShardManifest | None]:
        """The published manifest of every shard the statement names (None: nothing published yet); a shard
        left out is absent. Raises our errors: a damaged manifest :class:`PermanentError`, PostgreSQL out of
        reach :class:`StoreUnavailableError`."""
        recheck = bool(self.left_out) and self._clock() >= self._recheck_at
        if not self._joined and not recheck:
            return {}
        with reading_connection(self._pool, what=self._what) as conn:
            if recheck:
                self._look_up(conn)
            try:
                rows = self._rows(conn)
            except MISSING_TABLE:  # a table gone, or never made, since the last look-up (autocommit: no rollback)
                self._look_up(conn)
                rows = self._rows(conn)
        found: dict[int, ShardManifest | None] = dict.fromkeys(self._joined)
        for shard, text in rows:
            last = self._parsed.get(shard)
            if last is None or last[0] != text:
                last = self._parsed[shard] = (text, parse_published(text, shard))
            found[shard] = last[1]
        return found

    def _rows(self, conn: Any) -> list[tuple[int, str]]:
        if self._statement is None:
            return []
        rows: list[tuple[int, str]] = conn.execute(self._statement).fetchall()
        return rows

    def _look_up(self, conn: Any) -> None:
        schemas = {shard_schema(shard): shard for shard in self.shards}
        existing = {schemas[name] for (name,) in conn.execute(_EXISTING, (list(schemas),)).fetchall()}
        self._join(tuple(shard for shard in self.shards if shard in existing))
        self._recheck_at = self._clock() + self._recheck_s

    def _join(self, shards: tuple[int, ...]) -> None:
        self._joined = shards
        self._statement = sql.SQL(" UNION ALL ").join(
            sql.SQL("SELECT {n}::int, manifest FROM {s}.lexical_manifest").format(
                n=sql.Literal(shard), s=sql.Identifier(shard_schema(shard)))
            for shard in shards) if shards else None
