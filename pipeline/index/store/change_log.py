"""Which documents of a shard changed since a point in time, asked of PostgreSQL itself.

Every document write (index, skip, tombstone; :mod:`~shardfuse.pipeline.index.store.writes`) records, in the
same transaction, the id of the transaction that made it (``documents.change_xid``, indexed). A point in
time is a PostgreSQL *snapshot* (``pg_current_snapshot()``, text ``xmin:xmax:xip,…``), taken in the same
statement that lists the documents changed since the previous one. A change is "since" snapshot S exactly
when its transaction is not visible in S: the transaction id is at least S's ``xmax``, or in S's list of
transactions in progress. That is exact whatever order transactions commit in — a sequence number would
not be (a number drawn first can commit last, after a reader has moved past it) — and it needs no lock:
writers never wait for the BM25 update.

A BM25 index built from the rows visible in S records S in its manifest; the next update asks for the
changes since S and indexes just those documents. Nothing here lives in Redis, so losing Redis (a crash
that loses its last second, a failover, a flush) or losing the bookkeeping after a commit can never hide
a committed document from the keyword leg.

Tombstones are never purged (a document row lives for good), so "changed since" always finds a delete.
Transaction ids only grow within one cluster; a database restored into another cluster counts from a
lower one, which the update and the monitors notice (a snapshot's xmax above the database's): full rebuild.
A row written before the column existed reads NULL: "not changed since any snapshot"; a shard that gains
the column is covered by a full rebuild, because its manifest predates snapshots
(:attr:`~shardfuse.pipeline.index.lexical.manifest.ShardManifest.built_snapshot`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import psycopg
from psycopg import sql

# The value every document write stores in ``documents.change_xid`` (its transaction's 64-bit id).
CHANGE_XID = "pg_current_xact_id()::text::bigint"
# ``documents`` column and index, added to shards created before them (see schema.py).
CHANGE_COLUMN_DDL = "ALTER TABLE {schema}.documents ADD COLUMN IF NOT EXISTS change_xid bigint"
CHANGE_INDEX = "documents_change_xid"
CHANGE_INDEX_DDL = "CREATE INDEX IF NOT EXISTS documents_change_xid ON {schema}.documents (change_xid)"

# The documents not visible in snapshot %(snap)s, written at or after its xmin: an index range scan on
# change_xid (the visible ones in [xmin, xmax) are filtered out, a window as wide as the writes in flight).
_UNSEEN = ("d.change_xid >= pg_snapshot_xmin(%(snap)s::pg_snapshot)::text::bigint "
           "AND NOT pg_visible_in_snapshot(d.change_xid::text::xid8, %(snap)s::pg_snapshot)")


class ChangeSet(NamedTuple):
    """A snapshot (``mark``, opaque; ``version``: its ``xmax``, which only grows) and the documents
    ``(zone, path)`` changed after the snapshot it was asked about, as of ``mark``."""

    mark: str
    version: int
    keys: list[tuple[str, str]]


class Lag(NamedTuple):
    """How far an index built at a snapshot is behind the shard: documents changed since, and how long ago
    (on the database's clock) the first of them was written (0: none)."""

    documents: int
    behind_s: float


def version_of(mark: str) -> int:
    """The ``xmax`` of a snapshot's text form: snapshots taken later never have a smaller one."""
    try:
        return int(mark.split(":", 2)[1])
    except (IndexError, ValueError) as exc:
        raise ValueError(f"not a PostgreSQL snapshot: {mark!r}") from exc


def current_mark(conn: psycopg.Connection[Any]) -> ChangeSet:
    """The snapshot of this moment (no documents)."""
    row = conn.execute("SELECT pg_current_snapshot()::text").fetchone()
    assert row is not None
    return ChangeSet(str(row[0]), version_of(str(row[0])), [])


def _xmax_now(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()
    assert row is not None
    return int(row[0])


def changes_since(conn: psycopg.Connection[Any], schema: sql.Identifier, mark: str) -> ChangeSet:
    """The documents changed since snapshot ``mark`` and, from the same statement (so the same snapshot),
    the snapshot they were read in."""
    query = sql.SQL(
        "SELECT pg_current_snapshot()::text, coalesce(array_agg(d.zone ORDER BY d.zone, d.path), '{{}}'), "
        "coalesce(array_agg(d.path ORDER BY d.zone, d.path), '{{}}') FROM {s}.documents d WHERE " + _UNSEEN
    ).format(s=schema)
    row = conn.execute(query, {"snap": mark}).fetchone()
    assert row is not None
    snapshot, zones, paths = row
    return ChangeSet(str(snapshot), version_of(str(snapshot)), list(zip(zones, paths, strict=True)))


def lag(conn: psycopg.Connection[Any], schema: sql.Identifier, mark: str | None) -> Lag:
    """:class:`Lag` of an index built at snapshot ``mark``; None: an index that tracks nothing (none yet,
    or built before snapshots), behind by every document of the shard."""
    if mark is not None and _xmax_now(conn) < version_of(mark):
        mark = None  # another cluster (a restore into a new one): its ids say nothing about this index
    where = sql.SQL(_UNSEEN if mark is not None else "d.seq >= 0")
    query = sql.SQL(
        "SELECT count(*), coalesce(extract(epoch FROM now() - min(d.updated_at)), 0) FROM {s}.documents d WHERE {w}"
    ).format(s=schema, w=where)
    row = conn.execute(query, {"snap": mark} if mark is not None else None).fetchone()
    assert row is not None
    return Lag(int(row[0]), max(0.0, float(row[1])))
