"""Connection pools for shard databases."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from pgvector.psycopg import register_vector
from psycopg import pq
from psycopg_pool import ConnectionPool, PoolTimeout

from shardfuse.pipeline.core.errors import StoreUnavailableError


def _configure(conn: psycopg.Connection[Any]) -> None:
    register_vector(conn)


def open_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 8, timeout: float = 30.0
) -> ConnectionPool[psycopg.Connection[Any]]:
    """Open a pool whose connections know the ``vector`` type.

    The extension is created first on a plain connection: ``register_vector`` fails on a database that
    does not have it yet, and a pool that failed its configure step would retry forever in the background.
    """
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.OperationalError as exc:
        raise StoreUnavailableError(f"cannot reach PostgreSQL at {_redact(dsn)}: {exc}") from exc
    pool = ConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        configure=_configure,
        timeout=timeout,
        open=False,
        name="shardfuse",
    )
    pool.open(wait=True, timeout=timeout)
    return pool


def _redact(dsn: str) -> str:
    """A DSN fit for an error message: the password, if any, replaced."""
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    if "password" in info:
        info["password"] = "***"
    return psycopg.conninfo.make_conninfo("", **{k: str(v) for k, v in info.items() if v is not None})


@contextmanager
def pooled_connection(
    pool: ConnectionPool[psycopg.Connection[Any]], *, what: str
) -> Iterator[psycopg.Connection[Any]]:
    """A connection from ``pool``; losing the database becomes a :class:`StoreUnavailableError` (retried),
    naming ``what`` was being reached."""
    try:
        with pool.connection() as conn:
            yield conn
    except (psycopg.OperationalError, PoolTimeout) as exc:
        raise StoreUnavailableError(f"{what} database unavailable: {exc}") from exc


@contextmanager
def reading_connection(
    pool: ConnectionPool[psycopg.Connection[Any]], *, what: str
) -> Iterator[psycopg.Connection[Any]]:
    """A pooled connection in autocommit mode, for reads that are one statement each: no ``BEGIN`` and
    ``COMMIT`` round trips around them (a search's vector leg went from four round trips to one).

    Several statements on it do not share a snapshot; use ``conn.transaction()`` where they must. It goes
    back to the pool out of autocommit, as every other user of the pool expects; a connection left in any
    other state than idle is closed, and the pool replaces it.
    """
    with pooled_connection(pool, what=what) as conn:
        conn.autocommit = True
        try:
            yield conn
        finally:
            if conn.pgconn.transaction_status == pq.TransactionStatus.IDLE:
                conn.autocommit = False
            else:
                conn.close()


# Session settings each pooled connection holds (kept by connection, forgotten with it): a search sets
# ``hnsw.ef_search`` on a connection once, not in a transaction of its own on every query.
_session_values: weakref.WeakKeyDictionary[psycopg.Connection[Any], dict[str, str]] = weakref.WeakKeyDictionary()
_session_lock = threading.Lock()


def use_session_setting(conn: psycopg.Connection[Any], name: str, value: str) -> None:
    """Make ``conn``'s session setting ``name`` hold ``value``: a round trip only when it does not yet.

    For autocommit connections (:func:`reading_connection`): inside a transaction that rolls back, the
    setting would be undone behind this record's back.
    """
    with _session_lock:
        held = _session_values.setdefault(conn, {})
        if held.get(name) == value:
            return
    conn.execute("SELECT set_config(%s, %s, false)", (name, value))
    with _session_lock:
        held[name] = value
