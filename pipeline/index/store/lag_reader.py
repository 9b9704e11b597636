"""How far each shard's BM25 index is behind its documents, read from PostgreSQL for the monitors
(``shardfuse status``/``wait``, the exporter, the maintenance pool's watchdog) — which run outside the worker
runtime, so they hold one plain connection per database rather than the workers' pools."""

from __future__ import annotations

from types import TracebackType
from typing import Any

import psycopg
from psycopg import sql

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import SchemaMissingError
from shardfuse.pipeline.index.lexical.manifest import ShardManifest
from shardfuse.pipeline.index.store import change_log
from shardfuse.pipeline.index.store.change_log import Lag
from shardfuse.pipeline.index.store.connections import postgres_errors, postgres_location
from shardfuse.pipeline.index.store.lexical_publication import published_manifest
from shardfuse.pipeline.index.store.schema import shard_schema


class ShardLagReader:
    """:func:`~shardfuse.pipeline.index.store.change_log.lag` of any shard; one autocommit connection per
    distinct DSN, opened on first use, dropped after an error (the next call connects again)."""

    def __init__(self, settings: Settings, *, connect_timeout_s: int = 5) -> None:
        self._settings = settings
        self._connect_timeout_s = connect_timeout_s
        self._connections: dict[str, psycopg.Connection[Any]] = {}

    def lag(self, shard: int, mark: str | None) -> Lag:
        """The lag of an index of ``shard`` built at snapshot ``mark`` (None: no usable index). A shard whose
        tables no worker has created yet holds nothing to lag behind."""
        dsn = self._settings.shard_dsn(shard)
        try:
            with postgres_errors(f"shard {shard}", where=lambda: postgres_location(dsn)):
                conn = self._connection(dsn)
                try:
                    return change_log.lag(conn, sql.Identifier(shard_schema(shard)), mark)
                except psycopg.Error:
                    self._connections.pop(dsn, None)
                    conn.close()
                    raise
        except SchemaMissingError:
            return Lag(0, 0.0)

    def published_manifest(self, shard: int) -> ShardManifest | None:
        """The BM25 manifest published for ``shard`` (None: nothing yet, or no worker created the shard)."""
        dsn = self._settings.shard_dsn(shard)
        with postgres_errors(f"shard {shard}", where=lambda: postgres_location(dsn)):
            conn = self._connection(dsn)
            try:
                return published_manifest(conn, sql.Identifier(shard_schema(shard)), shard)
            except psycopg.errors.UndefinedTable:
                return None
            except psycopg.Error:
                self._connections.pop(dsn, None)
                conn.close()
                raise

    def _connection(self, dsn: str) -> psycopg.Connection[Any]:
        conn = self._connections.get(dsn)
        if conn is None or conn.closed:
            conn = psycopg.connect(dsn, autocommit=True, connect_timeout=self._connect_timeout_s)
            self._connections[dsn] = conn
        return conn

    def close(self) -> None:
        for conn in self._connections.values():
            conn.close()
        self._connections.clear()

    def __enter__(self) -> ShardLagReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
