"""A search request, validated before any shard is touched."""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field

from shardfuse.pipeline.config.settings import DEFAULT_MODEL, MODEL_NAME
from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.pipeline.core.events import bad_character, quoted
from shardfuse.pipeline.index.store.filters import ChunkFilter
from shardfuse.query.fusion import Fusion

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
    fusion: Fusion = Fusion.RRF
    alpha: float = 0.5  # the vector leg's weight in weighted fusions
    rrf_k: int | None = None  # None: the configured default
    where: ChunkFilter = field(default_factory=ChunkFilter)  # path prefix and metadata equality
    # Per-request switches for the ranking stages; None follows the settings (query.boosts/router/expansion).
    boost: bool | None = None
    route: bool | None = None
    expand: bool | None = None
    # The embedding model to search with; None: the zone's own (``shardfuse reindex``). Naming one compares a
    # reindex's model with the zone's before switching over.
    model: str | None = None

    @classmethod
    def parse(
        cls,
        *,
        query: object,
        zone: object,
        k: object = 10,
        mode: object = "hybrid",
        fusion: object = "rrf",
        alpha: object = 0.5,
        rrf_k: object = None,
        path_prefix: object = None,
        filters: object = None,
        boost: object = None,
        route: object = None,
        expand: object = None,
        model: object = None,
        max_k: int = 1000,
    ) -> SearchRequest:
        """Build a request from untrusted RPC arguments; every problem is an :class:`InvalidQueryError`."""
        if not isinstance(query, str) or not query.strip():
            raise InvalidQueryError("query must be a non-empty string")
        if len(query) > MAX_QUERY_CHARS:
            raise InvalidQueryError(f"query is {len(query):,} characters; the limit is {MAX_QUERY_CHARS:,}: "
                                    "shorten it")
        _check_text("query", query)
        if not isinstance(zone, str) or not _ZONE.fullmatch(zone):
            raise InvalidQueryError(f"zone {quoted(zone)} is not a valid zone name (letters, digits, '_.-')")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= max_k:
            raise InvalidQueryError(f"k must be an integer from 1 to {max_k}, got {quoted(k)}")
        if not isinstance(mode, str) or mode not in {m.value for m in Mode}:
            choices = ", ".join(m.value for m in Mode)
            raise InvalidQueryError(f"unknown mode {quoted(mode)}; choose one of {choices}")
        if not isinstance(fusion, str) or fusion not in {f.value for f in Fusion}:
            choices = ", ".join(f.value for f in Fusion)
            raise InvalidQueryError(f"unknown fusion {quoted(fusion)}; choose one of {choices}")
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 <= alpha <= 1:
            raise InvalidQueryError(f"alpha must be a number from 0 to 1, got {quoted(alpha)}")
        if rrf_k is not None and (isinstance(rrf_k, bool) or not isinstance(rrf_k, int) or rrf_k < 1):
            raise InvalidQueryError(f"rrf_k must be a positive integer, got {quoted(rrf_k)}")
        if path_prefix is not None and (not isinstance(path_prefix, str) or not path_prefix):
            raise InvalidQueryError(f"path_prefix must be a non-empty string, got {quoted(path_prefix)}")
        if isinstance(path_prefix, str):
            _check_text("path_prefix", path_prefix)
        scalar = str | int | float | bool
        if filters is not None and not (
            isinstance(filters, dict) and all(isinstance(k, str) and isinstance(v, scalar) for k, v in filters.items())
        ):
            raise InvalidQueryError("filters must map metadata keys to strings, numbers or booleans")
        for key, value in (filters or {}).items():
            _check_text("a filter key", key)
            if isinstance(value, str):
                _check_text(f"filter {quoted(key)}", value)
            elif isinstance(value, float) and not math.isfinite(value):
                raise InvalidQueryError(f"filter {quoted(key)} is {value}; a filter value must be a finite number")
        for name, switch in (("boost", boost), ("route", route), ("expand", expand)):
            if switch is not None and not isinstance(switch, bool):
                raise InvalidQueryError(f"{name} must be true, false or null, got {quoted(switch)}")
        if model is not None and not (isinstance(model, str)
                                      and (model == DEFAULT_MODEL or MODEL_NAME.fullmatch(model))):
            raise InvalidQueryError(f"model {quoted(model)} is not an embedding model name")
        where = ChunkFilter(path_prefix=path_prefix, metadata=dict(filters or {}))
        return cls(query=query, zone=zone, k=k, mode=Mode(mode), fusion=Fusion(fusion), alpha=float(alpha),
                   rrf_k=rrf_k, where=where, boost=_switch(boost), route=_switch(route), expand=_switch(expand),
                   model=model)


def _check_text(what: str, text: str) -> None:
    """What the shards and caches cannot take (a NUL, a lone surrogate) is refused before they see it."""
    problem = bad_character(text)
    if problem:
        raise InvalidQueryError(f"{what} contains {problem}: remove it")


def _switch(value: object) -> bool | None:
    return value if isinstance(value, bool) else None
