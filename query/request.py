"""A search request: the ``shardfuse.search`` task's arguments, validated before any shard is touched.

:class:`SearchRequest`'s fields ARE the task's argument list: the task, the client and the CLI take the names
from it (:data:`ARGUMENTS`). :func:`parse_request` turns a caller's arguments into a request, filling the zone's
fusion defaults from the settings, and reports every problem as one :class:`InvalidQueryError` naming the
arguments: pydantic's errors are put in words in one place, :func:`_invalid`, from each field's
``description`` (what the argument must be) and the validators' own messages.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from shardfuse.pipeline.config.settings import DEFAULT_MODEL, MODEL_NAME, QuerySettings
from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.pipeline.core.text_checks import bad_character, quoted
from shardfuse.pipeline.core.zones import Zone
from shardfuse.pipeline.index.store.filters import ChunkFilter
from shardfuse.query.fusion import Fusion

MAX_QUERY_CHARS = 4096
# Zones one request may name: each adds a vector search and a keyword search per shard.
MAX_ZONES = 8


class Mode(enum.StrEnum):
    HYBRID = "hybrid"
    KEYWORD = "keyword"
    SEMANTIC = "semantic"
    GREP = "grep"  # matching lines of a literal or an RE2 regex, from the trigram index (query/grep/)

    @property
    def uses_keyword(self) -> bool:
        return self in (Mode.HYBRID, Mode.KEYWORD)

    @property
    def uses_vector(self) -> bool:
        return self in (Mode.HYBRID, Mode.SEMANTIC)


def _not_as_described() -> PydanticCustomError:
    """A value outside what the field's ``description`` says, which :func:`_invalid` then quotes."""
    return PydanticCustomError("not_as_described", "not as the field's description says")


def _storable(value: object) -> object:
    """What the shards and caches cannot take (a NUL, a lone surrogate) is refused before they see it (before
    pydantic's own string checks, whose message for a lone surrogate is "unable to parse raw data")."""
    problem = bad_character(value) if isinstance(value, str) else None
    if problem:
        raise ValueError(f"contains {problem}: remove it")
    return value


def _query_text(query: str) -> str:
    if not query.strip():
        raise _not_as_described()
    if len(query) > MAX_QUERY_CHARS:
        raise ValueError(f"is {len(query):,} characters; the limit is {MAX_QUERY_CHARS:,}: shorten it")
    return query


def _at_most_max_k(k: int, info: ValidationInfo) -> int:
    """``query.max_k``, when the request comes from :func:`parse_request` (a request built in code is trusted)."""
    return _at_most("max_k", k, info)


def _at_most_max_leg_depth(depth: int | None, info: ValidationInfo) -> int | None:
    """``query.max_leg_depth``, when the request comes from :func:`parse_request`."""
    return None if depth is None else _at_most("max_leg_depth", depth, info)


def _at_most(limit: str, value: int, info: ValidationInfo) -> int:
    bound = info.context.get(limit) if isinstance(info.context, dict) else None
    if bound is not None and value > bound:
        raise _not_as_described()
    return value


def _distinct_zones(zones: tuple[str, ...]) -> tuple[str, ...]:
    twice = sorted({quoted(zone) for zone in zones if zones.count(zone) > 1})
    if twice:
        raise ValueError(f"name {', '.join(twice)} more than once; name each zone once")
    return zones


def _grep_only(value: bool | None, info: ValidationInfo) -> bool | None:
    """``regex`` and ``case_sensitive`` shape a grep; given to another mode they would silently do nothing."""
    if value is not None and info.data.get("mode") is not Mode.GREP:
        raise ValueError("applies to mode 'grep' only: pass mode='grep' (or leave it out)")
    return value


def _ranked_only(value: int | None, info: ValidationInfo) -> int | None:
    """``max_per_file`` caps ranked chunks; a grep answers lines, where it would silently do nothing."""
    if value is not None and info.data.get("mode") is Mode.GREP:
        raise ValueError("does not apply to mode 'grep', whose results are lines")
    return value


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"is {value}; a filter value must be a finite number")
    return value


def _model_name(model: object) -> object:
    if model is None or (isinstance(model, str) and (model == DEFAULT_MODEL or MODEL_NAME.fullmatch(model))):
        return model
    raise ValueError(f"{quoted(model)} is not an embedding model name")


Text = Annotated[StrictStr, BeforeValidator(_storable)]
FilterValue = Annotated[StrictStr | StrictInt | StrictFloat | StrictBool, BeforeValidator(_storable),
                        AfterValidator(_finite)]
_SWITCH = "true, false or null"


class SearchRequest(BaseModel):
    """One search of one zone (or several, ``zones``). Its fields are the ``shardfuse.search`` task's arguments,
    in wire order; build one from a caller's arguments with :func:`parse_request`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    query: Annotated[Text, AfterValidator(_query_text), Field(description="a non-empty string")]
    zone: Annotated[Zone, Field(description="a zone name")]
    k: Annotated[StrictInt, Field(ge=1, description="an integer from 1 to {max_k}"),
                 AfterValidator(_at_most_max_k)] = 10
    mode: Mode = Mode.HYBRID
    fusion: Fusion = Fusion.RRF
    # The vector leg's weight in weighted fusions.
    alpha: Annotated[float, Field(strict=True, ge=0, le=1, description="a number from 0 to 1")] = 0.5
    # None: the configured default (query.rrf_k).
    rrf_k: Annotated[Annotated[StrictInt, Field(ge=1)] | None, Field(description="a positive integer")] = None
    # Only chunks whose path starts with this, and whose metadata holds every filters pair (ChunkFilter).
    path_prefix: Annotated[Annotated[Text, Field(min_length=1)] | None,
                           Field(description="a non-empty string")] = None
    filters: Annotated[dict[Text, FilterValue] | None,
                       Field(description="a map of metadata keys to strings, numbers or booleans")] = None
    # False: answer without the result cache and the query-embedding cache (timings include the model, as a
    # first-time query's would). Any value counts by its truth, as the task has always taken it.
    cache: Annotated[bool, BeforeValidator(bool)] = True
    # Per-request switches for the ranking stages; None follows the settings (query.boosts/router/expansion).
    boost: Annotated[StrictBool | None, Field(description=_SWITCH)] = None
    route: Annotated[StrictBool | None, Field(description=_SWITCH)] = None
    expand: Annotated[StrictBool | None, Field(description=_SWITCH)] = None
    rerank: Annotated[StrictBool | None, Field(description=_SWITCH)] = None  # None: as [rerank] says
    # The embedding model to search with; None: the zone's own (``shardfuse reindex``). Naming one compares a
    # reindex's model with the zone's before switching over.
    model: Annotated[str | None, BeforeValidator(_model_name)] = None
    # Several zones searched as one (a caller names ``zone`` or ``zones``, not both): each zone's legs and
    # hydration are its own, the keyword leg scores with the named zones' statistics summed, and every result
    # says its zone. Always filled (``(zone,)`` for a one-zone request), and ``zone`` is always ``zones[0]``.
    zones: Annotated[tuple[Zone, ...], Field(min_length=1, max_length=MAX_ZONES,
                                             description=f"a list of 1 to {MAX_ZONES} zone names"),
                     AfterValidator(_distinct_zones)] = ()
    # Results whose final ``score`` (after fusion and boosts) is below this are left out. Fused scores depend on
    # the fusion (RRF's are about 1/(rrf_k + rank), weighted ones 0 to 1): compare within one fusion only.
    min_score: Annotated[Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)] | None,
                         Field(description="a number of at least 0")] = None
    # Vector candidates less similar (cosine, -1 to 1) to the query (or an expansion's variant) than this are
    # dropped before fusion: in semantic mode no result is less similar; in hybrid mode a keyword candidate
    # still counts (its similarity is not known).
    min_similarity: Annotated[Annotated[float, Field(strict=True, ge=-1, le=1)] | None,
                              Field(description="a number from -1 to 1")] = None
    # Candidates the keyword / vector leg brings to fusion (per zone searched, then merged to this many);
    # None: k × query.over_fetch × the router's multiplier, at least query.min_leg_depth. Expansion legs keep
    # that default.
    keyword_depth: Annotated[Annotated[StrictInt, Field(ge=1)] | None,
                             Field(description="an integer from 1 to {max_leg_depth}"),
                             AfterValidator(_at_most_max_leg_depth)] = None
    vector_depth: Annotated[Annotated[StrictInt, Field(ge=1)] | None,
                            Field(description="an integer from 1 to {max_leg_depth}"),
                            AfterValidator(_at_most_max_leg_depth)] = None
    # False: results without ``text`` (nor ``truncated``): ids, paths, lines, scores and metadata only.
    include_text: Annotated[StrictBool, Field(description="true or false")] = True
    # At most this many results from one file (a zone's path), e.g. 1 for a list of distinct documents; 0: no
    # cap. None: query.max_chunks_per_file. Not for mode="grep", whose results are lines.
    max_per_file: Annotated[Annotated[StrictInt, Field(ge=0)] | None,
                            Field(description="an integer of at least 0"), AfterValidator(_ranked_only)] = None
    # mode="grep" only: the query is an RE2 regular expression (else a literal); matching is case-sensitive
    # (as grep's and ripgrep's is) unless case_sensitive is false. None: not given.
    regex: Annotated[StrictBool | None, Field(description=_SWITCH), AfterValidator(_grep_only)] = None
    case_sensitive: Annotated[StrictBool | None, Field(description=_SWITCH), AfterValidator(_grep_only)] = None

    @model_validator(mode="before")
    @classmethod
    def _fill_zones(cls, data: Any) -> Any:
        """``zone`` and ``zones`` each filled from the other when only one is given."""
        if not isinstance(data, Mapping):
            return data
        zone, zones = data.get("zone"), data.get("zones")
        if zones is None and zone is not None:
            return {**data, "zones": [zone]}
        if zone is None and isinstance(zones, list | tuple) and zones:
            return {**data, "zone": zones[0]}
        return data

    @model_validator(mode="after")
    def _zone_is_the_first(self) -> SearchRequest:
        if self.zones[:1] != (self.zone,):
            raise ValueError(f"zone {quoted(self.zone)} must be the first of zones; name one or the other")
        return self

    @property
    def where(self) -> ChunkFilter:
        """The path prefix and metadata filters, as the shards apply them (false when there are none)."""
        return ChunkFilter(path_prefix=self.path_prefix, metadata=dict(self.filters or {}))


# The task's arguments, in order; everything else a caller sends is refused by name.
ARGUMENTS: tuple[str, ...] = tuple(SearchRequest.model_fields)


def parse_request(arguments: Mapping[str, Any], *, settings: QuerySettings) -> SearchRequest:
    """The request a caller's (untrusted) arguments describe. A ``fusion`` or ``alpha`` left out (or null) is
    the zone's (``query.zone_profiles``, else ``query.fusion``/``query.alpha``); ``k`` is at most
    ``query.max_k``. Every problem, each naming its argument, in one :class:`InvalidQueryError`."""
    zone, zones = arguments.get("zone"), arguments.get("zones")
    if zone is not None and zones is not None:  # the model would only check that they agree
        raise InvalidQueryError("name the zone with zone or zones, not both")
    first = zones[0] if isinstance(zones, list | tuple) and zones else None
    # Several zones: the first one's fusion defaults.
    fusion, alpha = settings.fusion_defaults(zone if zones is None else first)
    filled = {**arguments, "fusion": arguments.get("fusion") or fusion,
              "alpha": alpha if arguments.get("alpha") is None else arguments["alpha"]}
    limits = {"max_k": settings.max_k, "max_leg_depth": settings.max_leg_depth}
    try:
        return SearchRequest.model_validate(filled, context=limits)
    except ValidationError as exc:
        raise _invalid(exc, filled, limits=limits) from exc


def _invalid(exc: ValidationError, arguments: Mapping[str, Any], *, limits: Mapping[str, int]) -> InvalidQueryError:
    """Pydantic's errors as one message: unknown arguments first (and the ones the task takes), then one
    sentence per problem, in field order. A zone is reported once, under the name the caller gave it by
    (``zone`` and ``zones`` are filled from each other)."""
    errors = exc.errors()
    unknown = sorted(quoted(error["loc"][0]) for error in errors if error["type"] == "extra_forbidden")
    problems = []
    if unknown:
        problems.append(f"unknown search argument(s) {', '.join(unknown)}; the task takes {', '.join(ARGUMENTS)}")
    echoed = "zone" if arguments.get("zones") is not None else "zones"  # the one filled from the other
    problems += [_problem(error, arguments, limits=limits) for error in errors
                 if error["type"] != "extra_forbidden" and (error["loc"][:1] or ("",))[0] != echoed]
    return InvalidQueryError("; ".join(dict.fromkeys(problems)))  # a union's branches repeat one sentence


def _problem(error: ErrorDetails, arguments: Mapping[str, Any], *, limits: Mapping[str, int]) -> str:
    """One error in words: a validator's own message after what it is about; otherwise what the argument must
    be (its field's description, or the enum's choices) and what it got."""
    loc = error["loc"]
    if not loc:  # a check of the whole request
        return str(error["msg"]).removeprefix("Value error, ")
    name = str(loc[0])
    if error["type"] == "value_error":
        return f"{_subject(loc)} {str(error['msg']).removeprefix('Value error, ')}"
    got = quoted(arguments[name]) if name in arguments else "nothing"
    field = SearchRequest.model_fields[name]
    if isinstance(field.annotation, type) and issubclass(field.annotation, enum.Enum):
        return f"unknown {name} {got}; choose one of {', '.join(str(c.value) for c in field.annotation)}"
    return f"{name} must be {str(field.description).format(**limits)}, got {got}"


def _subject(loc: tuple[int | str, ...]) -> str:
    """What an error's location is, in words: ``zone``; in ``filters``, ``filter 'team'`` or ``a filter key``;
    in ``zones``, ``zones[1]``."""
    if loc[0] == "zones" and len(loc) > 1:
        return f"zones[{loc[1]}]"
    if loc[0] != "filters" or len(loc) == 1:
        return str(loc[0])
    return "a filter key" if loc[-1] == "[key]" else f"filter {quoted(loc[1])}"
