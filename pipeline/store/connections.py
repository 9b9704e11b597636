"""Connection pools for shard databases."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from pgvector.psycopg import register_vector
from psycopg_pool import ConnectionPool, PoolTimeout

from pipeline.errors import StoreUnavailableError


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
