"""Result filters applied inside each search leg, and their SQL."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from psycopg import sql

Scalar = str | int | float | bool | None


@dataclass(frozen=True, slots=True)
class ChunkFilter:
    """Chunks whose path starts with ``path_prefix`` and whose metadata holds every ``metadata`` pair."""

    path_prefix: str | None = None
    metadata: dict[str, Scalar] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.path_prefix) or bool(self.metadata)

    def sql(self) -> tuple[sql.Composable, list[Any]]:
        """``AND ...`` conditions on the ``chunks`` table, with their parameters."""
        parts: list[sql.Composable] = []
        params: list[Any] = []
        if self.path_prefix:
            # LIKE with the prefix's own wildcards escaped: "a_b/" must not match "axb/".
            escaped = self.path_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            parts.append(sql.SQL(" AND path LIKE %s ESCAPE '\\'"))
            params.append(escaped + "%")
        if self.metadata:
            parts.append(sql.SQL(" AND metadata @> %s::jsonb"))
            params.append(json.dumps(self.metadata))
        return sql.Composed(parts), params
