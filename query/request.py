"""A search request, validated before any shard is touched."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from pipeline.errors import InvalidQueryError

_ZONE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
MAX_QUERY_CHARS = 4096


class Mode(enum.StrEnum):
    HYBRID = "hybrid"
    KEYWORD = "keyword"
    SEMANTIC = "semantic"

    @property
    def uses_keyword(self) -> bool:
        return self is not Mode.SEMANTIC

    @property
    def uses_vector(self) -> bool:
        return self is not Mode.KEYWORD


@dataclass(frozen=True, slots=True)
class SearchRequest:
    query: str
    zone: str
    k: int = 10
    mode: Mode = Mode.HYBRID

    @classmethod
    def parse(cls, *, query: object, zone: object, k: object = 10, mode: object = "hybrid",
              max_k: int = 1000) -> SearchRequest:
        """Build a request from untrusted RPC arguments; every problem is an :class:`InvalidQueryError`."""
        if not isinstance(query, str) or not query.strip():
            raise InvalidQueryError("query must be a non-empty string")
        if len(query) > MAX_QUERY_CHARS:
            raise InvalidQueryError(f"query is {len(query)} characters; the limit is {MAX_QUERY_CHARS}")
        if not isinstance(zone, str) or not _ZONE.match(zone):
            raise InvalidQueryError(f"zone {zone!r} is not a valid zone name (letters, digits, '_.-')")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= max_k:
            raise InvalidQueryError(f"k must be an integer from 1 to {max_k}, got {k!r}")
        if not isinstance(mode, str) or mode not in {m.value for m in Mode}:
            choices = ", ".join(m.value for m in Mode)
            raise InvalidQueryError(f"unknown mode {mode!r}; choose one of {choices}")
        return cls(query=query, zone=zone, k=k, mode=Mode(mode))
