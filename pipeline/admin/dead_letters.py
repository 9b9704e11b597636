"""The dead-letter store: failed work with a reason a person can act on.

PostgreSQL errors reach callers as ours (:mod:`shardfuse.pipeline.index.store.connections`): the store out of
reach is a :class:`~shardfuse.pipeline.core.errors.StoreUnavailableError`, its table not created yet a
:class:`~shardfuse.pipeline.core.errors.SchemaMissingError`.
"""

from __future__ import annotations

import json
import math
from contextlib import AbstractContextManager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from shardfuse.pipeline.index.store.connections import pooled_connection
from shardfuse.pipeline.index.store.schema import SHARED_SCHEMA


def record_dead_letter(
    pool: ConnectionPool[Any],
    *,
    task: str,
    payload: dict[str, Any],
    error_class: str,
    reason: str,
    attempts: int,
) -> int:
    """Store one failed message; returns its id. The zone and path are read from the payload's event (an
    ingest event, or an embed document's event) when it has one."""
    document = payload.get("document")
    event = payload.get("event") if isinstance(payload.get("event"), dict) else None
    if event is None and isinstance(document, dict) and isinstance(document.get("event"), dict):
        event = document["event"]
    zone = event.get("zone") if event else payload.get("zone")
    path = event.get("path") if event else payload.get("path")
    # PostgreSQL's text and jsonb refuse NUL, lone surrogates and NaN: a payload that carries one (often the
    # very reason it failed) is stored with them spelled out, or it could never be dead-lettered.
    row_values = (task, json.dumps(_storable(payload), default=str, allow_nan=False), _storable(_text(zone)),
                  _storable(_text(path)), _storable(error_class), _storable(reason), attempts)
    with _connection(pool) as conn:
        row = conn.execute(
            f"INSERT INTO {SHARED_SCHEMA}.deadletters (task, payload, zone, path, error_class, reason, attempts) "
            "VALUES (%s, %s::jsonb, %s, %s, %s, %s, %s) RETURNING id",
            row_values,
        ).fetchone()
    assert row is not None
    return int(row[0])


def _connection(pool: ConnectionPool[Any]) -> AbstractContextManager[psycopg.Connection[Any]]:
    return pooled_connection(pool, what="the shared (dead letters)")


def _storable(value: Any) -> Any:
    """``value`` as PostgreSQL can store it, at any depth: NUL written as ``\\u0000``, a lone surrogate as
    its ``\\udcxx`` escape, NaN and infinities as strings."""
    if isinstance(value, str):
        return value.replace("\x00", "\\u0000").encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {_storable(k): _storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_storable(v) for v in value]
    return value


def dead_letter_count(pool: ConnectionPool[Any]) -> int:
    with _connection(pool) as conn:
        row = conn.execute(f"SELECT count(*) FROM {SHARED_SCHEMA}.deadletters").fetchone()
    return int(row[0]) if row else 0


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def recent_dead_letters(pool: ConnectionPool[Any], *, limit: int = 10) -> list[dict[str, Any]]:
    """The newest dead letters, for ``shardfuse status``."""
    with _connection(pool) as conn:
        rows = conn.execute(
            f"SELECT id, task, zone, path, error_class, reason, attempts, last_failed "
            f"FROM {SHARED_SCHEMA}.deadletters ORDER BY id DESC LIMIT %s",
            (limit,),
        ).fetchall()
    keys = ("id", "task", "zone", "path", "error_class", "reason", "attempts", "last_failed")
    return [dict(zip(keys, row, strict=True)) for row in rows]


_COLUMNS = ("id", "task", "zone", "path", "error_class", "reason", "attempts", "first_failed", "last_failed")


def list_dead_letters(pool: ConnectionPool[Any], *, zone: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Dead letters, newest first (of one zone, when given)."""
    where = "WHERE zone = %s " if zone is not None else ""
    params: tuple[Any, ...] = (zone, limit) if zone is not None else (limit,)
    with _connection(pool) as conn:
        rows = conn.execute(
            f"SELECT {', '.join(_COLUMNS)} FROM {SHARED_SCHEMA}.deadletters {where}ORDER BY id DESC LIMIT %s", params
        ).fetchall()
    return [dict(zip(_COLUMNS, row, strict=True)) for row in rows]


def get_dead_letter(pool: ConnectionPool[Any], dead_id: int) -> dict[str, Any] | None:
    """One dead letter with its payload, or None."""
    with _connection(pool) as conn:
        row = conn.execute(
            f"SELECT {', '.join(_COLUMNS)}, payload FROM {SHARED_SCHEMA}.deadletters WHERE id = %s", (dead_id,)
        ).fetchone()
    return None if row is None else dict(zip((*_COLUMNS, "payload"), row, strict=True))


def take_dead_letters(pool: ConnectionPool[Any], ids: list[int] | None, send: Any) -> list[int]:
    """Hand dead letters back to their tasks: ``send(task, payload)`` for each (all when ``ids`` is None);
    returns the ids sent, each sent once even when several retries run at once.

    Each letter is taken by ``DELETE … RETURNING`` and sent inside that transaction: a concurrent retry's
    DELETE of the same row waits for the row lock and then finds it gone (or, if this send failed and rolled
    back, takes it itself), so only the transaction whose DELETE returned the row sends it. A failed send
    rolls its DELETE back, leaves the letter in place, and raises: the letters after it stay too. A commit
    that fails after a successful send can leave a letter both sent and stored (sent again by a later retry;
    every task is idempotent), never neither.
    """
    table = f"{SHARED_SCHEMA}.deadletters"
    retried: list[int] = []
    with _connection(pool) as conn:
        where = " WHERE id = ANY(%s)" if ids is not None else ""
        candidates = [int(row[0]) for row in conn.execute(
            f"SELECT id FROM {table}{where} ORDER BY id", (ids,) if ids is not None else ()).fetchall()]
        conn.commit()  # each letter below in a transaction of its own
        for dead_id in candidates:
            with conn.transaction():
                row = conn.execute(f"DELETE FROM {table} WHERE id = %s RETURNING task, payload", (dead_id,)).fetchone()
                if row is None:
                    continue  # another retry took it first
                send(row[0], row[1])
            retried.append(dead_id)
    return retried


def purge_dead_letters(pool: ConnectionPool[Any], *, zone: str | None = None) -> int:
    """Delete dead letters (of one zone, when given); how many."""
    with _connection(pool) as conn:
        if zone is None:
            cur = conn.execute(f"DELETE FROM {SHARED_SCHEMA}.deadletters")
        else:
            cur = conn.execute(f"DELETE FROM {SHARED_SCHEMA}.deadletters WHERE zone = %s", (zone,))
        return int(max(cur.rowcount, 0))
