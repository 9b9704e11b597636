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
)
from pydantic_core import ErrorDetails, PydanticCustomError

from shardfuse.pipeline.config.settings import DEFAULT_MODEL, MODEL_NAME, QuerySettings
from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.pipeline.core.text_checks import bad_character, quoted
from shardfuse.pipeline.core.zones import Zone
from shardfuse.pipeline.index.store.filters import ChunkFilter
from shardfuse.query.fusion import Fusion

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
    max_k = info.context.get("max_k") if isinstance(info.context, dict) else None
    if max_k is not None and k > max_k:
        raise _not_as_described()
    return k


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
    """One search of one zone. Its fields are the ``shardfuse.search`` task's arguments, in wire order; build
    one from a caller's arguments with :func:`parse_request`."""

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
    # The embedding model to search with; None: the zone's own (``shardfuse reindex``). Naming one compares a
    # reindex's model with the zone's before switching over.
    model: Annotated[str | None, BeforeValidator(_model_name)] = None

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
    fusion, alpha = settings.fusion_defaults(arguments.get("zone"))
    filled = {**arguments, "fusion": arguments.get("fusion") or fusion,
              "alpha": alpha if arguments.get("alpha") is None else arguments["alpha"]}
    try:
        return SearchRequest.model_validate(filled, context={"max_k": settings.max_k})
    except ValidationError as exc:
        raise _invalid(exc, filled, max_k=settings.max_k) from exc


def _invalid(exc: ValidationError, arguments: Mapping[str, Any], *, max_k: int) -> InvalidQueryError:
    """Pydantic's errors as one message: unknown arguments first (and the ones the task takes), then one
    sentence per problem, in field order."""
    errors = exc.errors()
    unknown = sorted(quoted(error["loc"][0]) for error in errors if error["type"] == "extra_forbidden")
    problems = []
    if unknown:
        problems.append(f"unknown search argument(s) {', '.join(unknown)}; the task takes {', '.join(ARGUMENTS)}")
    problems += [_problem(error, arguments, max_k=max_k) for error in errors if error["type"] != "extra_forbidden"]
    return InvalidQueryError("; ".join(dict.fromkeys(problems)))  # a union's branches repeat one sentence


def _problem(error: ErrorDetails, arguments: Mapping[str, Any], *, max_k: int) -> str:
    """One error in words: a validator's own message after what it is about; otherwise what the argument must
    be (its field's description, or the enum's choices) and what it got."""
    loc = error["loc"]
    name = str(loc[0])
    if error["type"] == "value_error":
        return f"{_subject(loc)} {str(error['msg']).removeprefix('Value error, ')}"
    got = quoted(arguments[name]) if name in arguments else "nothing"
    field = SearchRequest.model_fields[name]
    if isinstance(field.annotation, type) and issubclass(field.annotation, enum.Enum):
        return f"unknown {name} {got}; choose one of {', '.join(str(c.value) for c in field.annotation)}"
    return f"{name} must be {str(field.description).format(max_k=max_k)}, got {got}"


def _subject(loc: tuple[int | str, ...]) -> str:
    """What an error's location is, in words: ``zone``; in ``filters``, ``filter 'team'`` or ``a filter key``."""
    if loc[0] != "filters" or len(loc) == 1:
        return str(loc[0])
    return "a filter key" if loc[-1] == "[key]" else f"filter {quoted(loc[1])}"
