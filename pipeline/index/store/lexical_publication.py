"""Where a shard's BM25 index is published for every node: its own PostgreSQL schema.

Three tables in the shard's schema (created with it, :mod:`.schema`):

* ``lexical_manifest`` — one row, the published :class:`~shardfuse.pipeline.index.lexical.manifest.ShardManifest`.
  Publishing is one ``UPDATE`` of it: a reader sees the old manifest or the new one.
* ``lexical_segments`` — one row per uploaded generation or delta directory (``gen_<g>``, ``delta_<n>``), with
  the id of the upload: a node's local copy carries that id, so a copy of another upload under the same name is
  never mistaken for it.
* ``lexical_files`` — the directory's files, in parts of :data:`PART_BYTES` (bytea, stored uncompressed: the
  arrays are already dense, and pglz would spend seconds on a large generation for a few percent).

Segments are immutable once uploaded and published; the manifest only ever names uploaded ones. Builders on
every node serialise on a session advisory lock per shard (:meth:`PostgresLexicalPublication.lock`), released
by the server when the builder's connection drops, so a killed builder never leaves a shard locked.

Every psycopg error becomes ours (:func:`~shardfuse.pipeline.index.store.connections.postgres_errors`): the
database out of reach is a :class:`~shardfuse.pipeline.core.errors.StoreUnavailableError` (retried).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from shardfuse.pipeline.core.errors import PermanentError
from shardfuse.pipeline.index.lexical.manifest import ShardManifest
from shardfuse.pipeline.index.lexical.mirror import UPLOAD_STAMP, SegmentGone
from shardfuse.pipeline.index.store.connections import pooled_connection, reading_connection

# Files are stored in parts of this size: a fetch holds at most a few parts in memory at once.
PART_BYTES = 8 * 1024 * 1024
# The advisory lock's first key ("SFLX"); the second is the shard number.
_LOCK_CLASS = 0x5346_4C58

LEXICAL_DDL = """
CREATE TABLE IF NOT EXISTS {schema}.lexical_manifest (
    id            boolean     PRIMARY KEY DEFAULT true CHECK (id),
    manifest      text        NOT NULL,
    published_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {schema}.lexical_segments (
    segment     text        PRIMARY KEY,
    upload      text        NOT NULL,
    bytes       bigint      NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {schema}.lexical_files (
    segment  text     NOT NULL REFERENCES {schema}.lexical_segments ON DELETE CASCADE,
    file     text     NOT NULL,
    part     integer  NOT NULL,
    data     bytea    NOT NULL,
    PRIMARY KEY (segment, file, part)
);
"""
# Run once, when the table is new (ALTER TABLE locks it even when nothing changes).
LEXICAL_STORAGE_DDL = "ALTER TABLE {schema}.lexical_files ALTER COLUMN data SET STORAGE EXTERNAL"


class PostgresLexicalPublication:
    """One shard's published BM25 index in its PostgreSQL schema."""

    def __init__(self, pool: ConnectionPool[Any], shard: int, *, schema: str) -> None:
        self._pool = pool
        self.shard = shard
        self._schema = sql.Identifier(schema)
        self._what = f"shard {shard}'s published BM25 index"

    def _q(self, text: str) -> sql.Composed:
        return sql.SQL(text).format(s=self._schema)

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the shard's publish lock (every node's builders) for the block."""
        with pooled_connection(self._pool, what=self._what) as conn:
            conn.autocommit = True
            conn.execute("SELECT pg_advisory_lock(%s, %s)", (_LOCK_CLASS, self.shard))
            try:
                yield
            finally:
                try:
                    conn.execute("SELECT pg_advisory_unlock(%s, %s)", (_LOCK_CLASS, self.shard))
                finally:
                    conn.autocommit = False

    def manifest(self) -> ShardManifest | None:
        """The published manifest, or None when nothing has been published yet."""
        with reading_connection(self._pool, what=self._what) as conn:
            return published_manifest(conn, self._schema, self.shard)

    def upload_of(self, segment: str) -> str | None:
        """The id of the upload published under ``segment``, or None when there is none."""
        with reading_connection(self._pool, what=self._what) as conn:
            row = conn.execute(self._q("SELECT upload FROM {s}.lexical_segments WHERE segment = %s"),
                               (segment,)).fetchone()
        return None if row is None else str(row[0])

    def upload(self, segment: str, directory: Path) -> str:
        """Store every file of ``directory`` as ``segment`` (replacing an unpublished upload of that name);
        return the new upload's id. Memory stays at one part whatever the files' size."""
        upload = uuid.uuid4().hex
        files = sorted(p for p in directory.iterdir() if p.is_file() and p.name != UPLOAD_STAMP)
        total = sum(p.stat().st_size for p in files)
        with pooled_connection(self._pool, what=self._what) as conn, conn.transaction():
            conn.execute(self._q("DELETE FROM {s}.lexical_segments WHERE segment = %s"), (segment,))
            conn.execute(self._q("INSERT INTO {s}.lexical_segments (segment, upload, bytes) VALUES (%s, %s, %s)"),
                         (segment, upload, total))
            insert = self._q("INSERT INTO {s}.lexical_files (segment, file, part, data) VALUES (%s, %s, %s, %s)")
            for path in files:
                with path.open("rb") as handle:
                    part = 0
                    while True:
                        data = handle.read(PART_BYTES)
                        if not data and part > 0:
                            break
                        conn.execute(insert, (segment, path.name, part, data))
                        part += 1
                        if len(data) < PART_BYTES:
                            break
        return upload

    def fetch(self, segment: str, target: Path) -> str:
        """Write ``segment``'s files into the (empty) directory ``target``; return the upload's id.
        ``SegmentGone`` when it is not (or no longer) stored."""
        with pooled_connection(self._pool, what=self._what) as conn, conn.transaction():
            row = conn.execute(self._q("SELECT upload FROM {s}.lexical_segments WHERE segment = %s"),
                               (segment,)).fetchone()
            if row is None:
                raise SegmentGone(segment)
            # A server-side cursor: parts arrive a few at a time, never the whole segment at once.
            with conn.cursor(name=f"fetch_{segment}") as cursor:
                cursor.itersize = 2
                cursor.execute(self._q("SELECT file, part, data FROM {s}.lexical_files WHERE segment = %s "
                                       "ORDER BY file, part"), (segment,))
                _write_parts(cursor, target)
        return str(row[0])

    def switch(self, manifest: ShardManifest) -> None:
        """Make ``manifest`` the published one (its segments must be uploaded)."""
        if manifest.shard != self.shard:
            raise ValueError(f"manifest of shard {manifest.shard} published to shard {self.shard}")
        with pooled_connection(self._pool, what=self._what) as conn, conn.transaction():
            conn.execute(self._q("INSERT INTO {s}.lexical_manifest (id, manifest) VALUES (true, %s) "
                                 "ON CONFLICT (id) DO UPDATE SET manifest = excluded.manifest, published_at = now()"),
                         (manifest.to_json(),))

    def segments(self) -> list[str]:
        """The names of every uploaded segment, the most recently uploaded first."""
        with reading_connection(self._pool, what=self._what) as conn:
            rows = conn.execute(self._q("SELECT segment FROM {s}.lexical_segments ORDER BY created_at DESC")).fetchall()
        return [str(r[0]) for r in rows]

    def delete(self, names: list[str]) -> None:
        """Delete the given segments (and their files)."""
        if names:
            with pooled_connection(self._pool, what=self._what) as conn, conn.transaction():
                conn.execute(self._q("DELETE FROM {s}.lexical_segments WHERE segment = ANY(%s)"), (names,))


def published_manifest(conn: psycopg.Connection[Any], schema: sql.Identifier, shard: int) -> ShardManifest | None:
    """The manifest published in ``schema`` (None: nothing published yet); :class:`PermanentError` when it is
    damaged or belongs to another shard."""
    row = conn.execute(sql.SQL("SELECT manifest FROM {s}.lexical_manifest").format(s=schema)).fetchone()
    return None if row is None else parse_published(row[0], shard)


def parse_published(text: str, shard: int) -> ShardManifest:
    """The manifest ``text`` published for ``shard``; :class:`PermanentError` when it is damaged or belongs to
    another shard."""
    try:
        manifest = ShardManifest.from_json(text)
    except ValueError as exc:
        raise PermanentError(f"shard {shard}: the published BM25 manifest is corrupt ({exc}); "
                             "rebuild the shard's BM25 index (`shardfuse bm25 rebuild`)") from exc
    if manifest.shard != shard:
        raise PermanentError(f"shard {shard}: the published BM25 manifest names shard {manifest.shard}; "
                             "check postgres.shard_dsns (a DSN listed for the wrong shard?)")
    return manifest


def _write_parts(cursor: psycopg.Cursor[Any], target: Path) -> None:
    handle = None
    current = ""
    try:
        for file, _part, data in cursor:
            if file != current:
                if handle is not None:
                    handle.close()
                if os.sep in file or file in ("", ".", ".."):
                    raise PermanentError(f"BM25 segment file name {file!r} is not a plain name")
                handle = (target / file).open("wb")
                current = file
            assert handle is not None
            handle.write(data)
    finally:
        if handle is not None:
            handle.close()
