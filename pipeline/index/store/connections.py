"""Connection pools for shard databases, and psycopg's errors translated into ours, in one place.

Every PostgreSQL adapter reaches the database through :func:`pooled_connection` or
:func:`reading_connection` (or, for a connection of its own, :func:`postgres_errors`), so nothing above the
adapters sees a ``psycopg.Error``:

- the database out of reach (connection refused or lost, the server shutting down or starting up, a pool
  that found no connection in time, out of connections or disk) is
  :class:`~shardfuse.pipeline.core.errors.StoreUnavailableError`;
- a table that does not exist yet is :class:`~shardfuse.pipeline.core.errors.SchemaMissingError`;
- anything else the server refused (a deadlock, a statement timeout, a constraint) is a plain
  :class:`~shardfuse.pipeline.core.errors.TransientError`, retried and then dead-lettered with the server's
  words.

Messages name what was being reached and where (``host:port/dbname``, never a password) and chain the
psycopg error as their cause. Inside the ``with`` block psycopg's own errors are still there to catch (say
``LockNotAvailable``); only what escapes it is translated.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from pgvector.psycopg import register_vector
from psycopg import errors, pq
from psycopg_pool import ConnectionPool

from shardfuse.pipeline.core.errors import (
    ConfigurationError,
    SchemaMissingError,
    ShardfuseError,
    StoreUnavailableError,
    TransientError,
)

log = logging.getLogger(__name__)

# SQLSTATE classes of a database out of reach: connection exception (08), insufficient resources (53),
# operator intervention stopping the server (57P), system error (58). Client-side failures (refused
# connections, a pool timeout) carry no SQLSTATE at all.
_UNREACHABLE_STATES = ("08", "53", "57P", "58")
MISSING_TABLE = (errors.UndefinedTable, errors.InvalidSchemaName)  # a schema or table no worker has created yet


def open_pool(
    dsn: str, *, min_size: int = 1, max_size: int = 8, timeout: float = 30.0
) -> ConnectionPool[psycopg.Connection[Any]]:
    """Open a pool whose connections know the ``vector`` type and what the database's pgvector can do
    (:func:`server_features`, read once here for the whole pool).

    The extension is created first on a plain connection: ``register_vector`` fails on a database that
    does not have it yet, and a pool that failed its configure step would retry forever in the background.
    """
    with postgres_errors("the", where=lambda: postgres_location(dsn)):
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            features = detect_features(conn)
        if not features.iterative_scan and features.available >= ITERATIVE_SCAN_SINCE:
            log.warning("%s: the vector extension is %s but the server has %s; `ALTER EXTENSION vector UPDATE` "
                        "(as its owner) enables iterative index scans for filtered searches",
                        postgres_location(dsn), _dotted(features.pgvector), _dotted(features.available))

        def configure(conn: psycopg.Connection[Any]) -> None:
            register_vector(conn)
            with _features_lock:
                _features[conn] = features

        pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            configure=configure,
            timeout=timeout,
            open=False,
            name="shardfuse",
        )
        try:
            pool.open(wait=True, timeout=timeout)
        except BaseException:
            pool.close()  # or it keeps trying to connect in the background
            raise
    return pool


def postgres_location(conninfo: str) -> str:
    """Where a connection string points, fit for a message: ``host:port/dbname``; no user, no password."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "<unparseable connection string>"
    host = params.get("host") or params.get("hostaddr") or "the default socket"
    dbname = params.get("dbname")
    return f"{host}:{params.get('port') or 5432}" + (f"/{dbname}" if dbname else "")


def translated(exc: psycopg.Error, *, what: str, where: str) -> ShardfuseError:
    """Our error for a psycopg error met while reaching ``what`` (``"shard 3"``) at ``where``."""
    if isinstance(exc, MISSING_TABLE):
        return SchemaMissingError(f"{what} database (PostgreSQL at {where}) lacks a table no worker has created "
                                  f"yet: {exc}")
    if _unreachable(exc):
        return StoreUnavailableError(f"{what} database unavailable (PostgreSQL at {where}): {exc}")
    return TransientError(f"{what} database (PostgreSQL at {where}) failed: {type(exc).__name__} "
                          f"[{exc.sqlstate or 'no SQLSTATE'}]: {exc}")


def _unreachable(exc: psycopg.Error) -> bool:
    if not isinstance(exc, psycopg.OperationalError):
        return False
    return exc.sqlstate is None or exc.sqlstate.startswith(_UNREACHABLE_STATES)


@contextmanager
def postgres_errors(what: str, *, where: str | Callable[[], str]) -> Iterator[None]:
    """Translate the psycopg errors escaping the block (:func:`translated`), chaining them as the cause.
    ``where`` may be a function, called only when there is an error to describe."""
    try:
        yield
    except psycopg.Error as exc:
        raise translated(exc, what=what, where=where if isinstance(where, str) else where()) from exc


def pool_location(pool: Any) -> str:
    """Where ``pool``'s connections go (:func:`postgres_location` of its ``conninfo``)."""
    conninfo = getattr(pool, "conninfo", None)
    return postgres_location(conninfo) if isinstance(conninfo, str) else "an unknown address"


@contextmanager
def pooled_connection(
    pool: ConnectionPool[psycopg.Connection[Any]], *, what: str
) -> Iterator[psycopg.Connection[Any]]:
    """A connection from ``pool``; psycopg errors escaping the block become ours (:func:`translated`), naming
    ``what`` was being reached: losing the database is a :class:`StoreUnavailableError` (retried)."""
    with postgres_errors(what, where=lambda: pool_location(pool)), pool.connection() as conn:
        yield conn


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


# pgvector 0.8's iterative index scans: an HNSW scan with a filter goes on until it found enough rows that pass.
ITERATIVE_SCAN_SINCE = (0, 8)


@dataclass(frozen=True, slots=True)
class ServerFeatures:
    """What a database's pgvector offers: ``pgvector`` is its ``vector`` extension's version (the SQL objects a
    query may use), ``available`` the version the server's files would update it to."""

    pgvector: tuple[int, ...]
    available: tuple[int, ...]

    @property
    def iterative_scan(self) -> bool:
        """``hnsw.iterative_scan`` exists (the extension itself, not only the server's library, is 0.8+)."""
        return self.pgvector >= ITERATIVE_SCAN_SINCE


def detect_features(conn: psycopg.Connection[Any]) -> ServerFeatures:
    """Read the ``vector`` extension's installed and available versions (one round trip)."""
    row = conn.execute(
        "SELECT e.extversion, a.default_version FROM pg_extension e "
        "JOIN pg_available_extensions a ON a.name = e.extname WHERE e.extname = 'vector'"
    ).fetchone()
    if row is None:
        raise ConfigurationError("the database has no vector extension: CREATE EXTENSION vector first")
    return ServerFeatures(pgvector=_version(row[0]), available=_version(row[1]))


def server_features(conn: psycopg.Connection[Any]) -> ServerFeatures:
    """What ``conn``'s database offers: recorded by its pool when :func:`open_pool` made it, read (once per
    connection) for any other connection."""
    with _features_lock:
        known = _features.get(conn)
    if known is None:
        known = detect_features(conn)
        with _features_lock:
            _features[conn] = known
    return known


def _version(text: Any) -> tuple[int, ...]:
    return tuple(int(part) for part in str(text).split(".") if part.isdigit())


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


_features: weakref.WeakKeyDictionary[psycopg.Connection[Any], ServerFeatures] = weakref.WeakKeyDictionary()
_features_lock = threading.Lock()


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
