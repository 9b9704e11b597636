"""Which embedding model each zone's queries use: one row per reindexed zone in the shared ``zone_models``
table (zones without a row use the default model).

Switching a zone over is one ``UPDATE`` of its row, so every query sees the old model or the new one, never
a mix: a query reads the zone's model once and embeds the query and searches the column of that same model.
Query workers read the table through :class:`ActiveModels`, at most once per ``ttl_s``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from shardfuse.pipeline.config.settings import DEFAULT_MODEL
from shardfuse.pipeline.core.errors import ConfigurationError, SchemaMissingError
from shardfuse.pipeline.index.store.connections import reading_connection

_COLUMNS = "zone, active, target, previous, started_at, switched_at"
# How long a query worker may go on using a zone's model after it changed (ActiveModels' read interval).
ACTIVE_MODELS_TTL_S = 1.0


@dataclass(frozen=True, slots=True)
class ZoneModel:
    zone: str
    active: str = DEFAULT_MODEL
    target: str | None = None      # a reindex in progress
    previous: str | None = None    # the model before the last switch (filled until `reindex finish`)
    started_at: datetime | None = None
    switched_at: datetime | None = None


def _row(row: tuple[Any, ...]) -> ZoneModel:
    return ZoneModel(*row)


def zone_model(conn: psycopg.Connection[Any], zone: str) -> ZoneModel:
    row = conn.execute(f"SELECT {_COLUMNS} FROM shardfuse.zone_models WHERE zone = %s", (zone,)).fetchone()
    return ZoneModel(zone) if row is None else _row(row)


def all_zone_models(conn: psycopg.Connection[Any]) -> list[ZoneModel]:
    rows = conn.execute(f"SELECT {_COLUMNS} FROM shardfuse.zone_models ORDER BY zone").fetchall()
    return [_row(r) for r in rows]


def begin(conn: psycopg.Connection[Any], zone: str, target: str) -> ZoneModel:
    """Record a reindex of ``zone`` to ``target``; starting the same one again is a no-op (it resumes)."""
    with conn.transaction():
        conn.execute("INSERT INTO shardfuse.zone_models (zone, active) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                     (zone, DEFAULT_MODEL))
        current = _row(conn.execute(f"SELECT {_COLUMNS} FROM shardfuse.zone_models WHERE zone = %s FOR UPDATE",
                                    (zone,)).fetchone())  # type: ignore[arg-type]
        if current.active == target:
            raise ConfigurationError(f"zone {zone!r} already uses model {target!r}")
        if current.target not in (None, target):
            raise ConfigurationError(f"zone {zone!r} is being reindexed to {current.target!r}: finish or abort that "
                                     f"first (shardfuse reindex abort --zone {zone})")
        conn.execute("UPDATE shardfuse.zone_models SET target = %s, started_at = coalesce(started_at, now()) "
                     "WHERE zone = %s AND target IS DISTINCT FROM %s", (target, zone, target))
    return zone_model(conn, zone)


def switch(conn: psycopg.Connection[Any], zone: str, *, expected_target: str) -> ZoneModel:
    """Make the reindex target the zone's model: one statement, so queries move over all at once."""
    with conn.transaction():
        updated = conn.execute(
            "UPDATE shardfuse.zone_models SET previous = active, active = target, target = NULL, "
            "switched_at = now(), started_at = NULL WHERE zone = %s AND target = %s",
            (zone, expected_target),
        ).rowcount
    if updated != 1:
        raise ConfigurationError(f"zone {zone!r} is not being reindexed to {expected_target!r}")
    return zone_model(conn, zone)


def abort(conn: psycopg.Connection[Any], zone: str) -> ZoneModel:
    with conn.transaction():
        conn.execute("UPDATE shardfuse.zone_models SET target = NULL, started_at = NULL WHERE zone = %s", (zone,))
    return zone_model(conn, zone)


def forget_previous(conn: psycopg.Connection[Any], zone: str) -> ZoneModel:
    with conn.transaction():
        conn.execute("UPDATE shardfuse.zone_models SET previous = NULL WHERE zone = %s", (zone,))
    return zone_model(conn, zone)


class ActiveModels:
    """The model each zone's queries use, read from ``zone_models`` at most once per ``ttl_s`` (one small
    table scan); a missing table (no zone was ever reindexed) means the default model everywhere."""

    def __init__(self, pool: ConnectionPool[Any], *, ttl_s: float = ACTIVE_MODELS_TTL_S) -> None:
        self._pool = pool
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._models: dict[str, str] = {}
        self._read_at = float("-inf")

    def model(self, zone: str) -> str:
        now = time.monotonic()
        if now - self._read_at >= self._ttl_s:
            with self._lock:
                if now - self._read_at >= self._ttl_s:
                    self._models = self._read()
                    self._read_at = time.monotonic()
        return self._models.get(zone, DEFAULT_MODEL)

    def _read(self) -> dict[str, str]:
        try:
            with reading_connection(self._pool, what="the zone models") as conn:
                rows = conn.execute("SELECT zone, active FROM shardfuse.zone_models").fetchall()
        except SchemaMissingError:
            return {}
        return {zone: active for zone, active in rows}
