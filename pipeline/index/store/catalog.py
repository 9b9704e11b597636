"""One column of a shard's table as PostgreSQL's catalog describes it: its type's name and modifier."""

from __future__ import annotations

from typing import Any, NamedTuple

import psycopg


class Column(NamedTuple):
    type_name: str  # pg_type.typname: "vector", "halfvec", "text", ...
    typmod: int  # a vector's dimensions; -1 for types without a modifier


def column(conn: psycopg.Connection[Any], schema: str, table: str, name: str) -> Column | None:
    """The column ``schema.table.name``, or None when the table or the column does not exist."""
    row = conn.execute(
        """
        SELECT t.typname, a.atttypmod FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        JOIN pg_type t ON t.oid = a.atttypid
        WHERE n.nspname = %s AND c.relname = %s AND a.attname = %s AND NOT a.attisdropped
        """,
        (schema, table, name),
    ).fetchone()
    return None if row is None else Column(str(row[0]), int(row[1]))
