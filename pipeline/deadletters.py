"""The dead-letter store: failed work with a reason a person can act on."""

from __future__ import annotations

import json
from typing import Any

from psycopg_pool import ConnectionPool

from pipeline.store.schema import SHARED_SCHEMA


def record_dead_letter(
    pool: ConnectionPool[Any],
    *,
    task: str,
    payload: dict[str, Any],
    error_class: str,
    reason: str,
    attempts: int,
) -> int:
    """Store one failed message; returns its id."""
    event = payload.get("event") if isinstance(payload.get("event"), dict) else None
    zone = event.get("zone") if event else payload.get("zone")
    path = event.get("path") if event else payload.get("path")
    with pool.connection() as conn:
        row = conn.execute(
            f"INSERT INTO {SHARED_SCHEMA}.deadletters (task, payload, zone, path, error_class, reason, attempts) "
            "VALUES (%s, %s::jsonb, %s, %s, %s, %s, %s) RETURNING id",
            (task, json.dumps(payload, default=str), _text(zone), _text(path), error_class, reason, attempts),
        ).fetchone()
    assert row is not None
    return int(row[0])


def dead_letter_count(pool: ConnectionPool[Any]) -> int:
    with pool.connection() as conn:
        row = conn.execute(f"SELECT count(*) FROM {SHARED_SCHEMA}.deadletters").fetchone()
    return int(row[0]) if row else 0


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def recent_dead_letters(pool: ConnectionPool[Any], *, limit: int = 10) -> list[dict[str, Any]]:
    """The newest dead letters, for ``shardfuse status``."""
    with pool.connection() as conn:
        rows = conn.execute(
            f"SELECT id, task, zone, path, error_class, reason, attempts, last_failed "
            f"FROM {SHARED_SCHEMA}.deadletters ORDER BY id DESC LIMIT %s",
            (limit,),
        ).fetchall()
    keys = ("id", "task", "zone", "path", "error_class", "reason", "attempts", "last_failed")
    return [dict(zip(keys, row, strict=True)) for row in rows]
