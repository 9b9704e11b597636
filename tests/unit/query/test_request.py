"""The search request (issue 19, "one validation style"): a pydantic model whose fields are the search task's
arguments, its defaults filled from the settings in one function, every problem put in words in one place."""

from __future__ import annotations

import pytest

from shardfuse.pipeline.config.settings import QuerySettings, ZoneProfile
from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.pipeline.index.store import ChunkFilter
from shardfuse.query.fusion import Fusion
from shardfuse.query.request import ARGUMENTS, Mode, SearchRequest, parse_request

# The wire contract of ``shardfuse.search``: callers have always sent these keyword arguments.
WIRE_ARGUMENTS = ("query", "zone", "k", "mode", "fusion", "alpha", "rrf_k", "path_prefix", "filters", "cache",
                  "boost", "route", "expand", "rerank", "model", "zones", "min_score", "min_similarity",
                  "keyword_depth", "vector_depth", "include_text", "max_per_file", "regex", "case_sensitive")


def test_the_model_fields_are_the_task_arguments_callers_send() -> None:
    assert ARGUMENTS == WIRE_ARGUMENTS


def test_a_full_request_keeps_what_the_caller_sent() -> None:
    arguments = {"query": "retry backoff", "zone": "docs", "k": 5, "mode": "keyword", "fusion": "weighted",
                 "alpha": 1, "rrf_k": 30, "path_prefix": "src/", "filters": {"lang": "py", "stars": 3, "ok": True},
                 "cache": False, "boost": False, "route": True, "expand": None, "model": "mini"}
    request = parse_request(arguments, settings=QuerySettings())
    assert (request.mode, request.fusion, request.alpha, request.rrf_k) == (Mode.KEYWORD, Fusion.WEIGHTED, 1.0, 30)
    assert request.where == ChunkFilter(path_prefix="src/", metadata={"lang": "py", "stars": 3, "ok": True})
    assert (request.cache, request.boost, request.route, request.expand, request.model) == (False, False, True,
                                                                                          None, "mini")
    assert not SearchRequest(query="q", zone="z").where  # no filter: the legs run unfiltered


def test_fusion_and_alpha_left_out_are_the_zones_and_k_is_capped_by_the_settings() -> None:
    settings = QuerySettings(fusion="convex", alpha=0.5, max_k=5,
                             zone_profiles={"tuned": ZoneProfile(fusion="rrf_weighted", alpha=0.3)})
    tuned = parse_request({"query": "q", "zone": "tuned"}, settings=settings)
    assert (tuned.fusion, tuned.alpha) == (Fusion.RRF_WEIGHTED, 0.3)
    other = parse_request({"query": "q", "zone": "other", "fusion": None, "alpha": None}, settings=settings)
    assert (other.fusion, other.alpha) == (Fusion.CONVEX, 0.5)
    named = parse_request({"query": "q", "zone": "tuned", "fusion": "rrf", "alpha": 0.9}, settings=settings)
    assert (named.fusion, named.alpha) == (Fusion.RRF, 0.9)
    assert parse_request({"query": "q", "zone": "z", "k": 5}, settings=settings).k == 5
    with pytest.raises(InvalidQueryError, match=r"^k must be an integer from 1 to 5, got 6$"):
        parse_request({"query": "q", "zone": "z", "k": 6}, settings=settings)


def test_every_problem_is_listed_unknown_arguments_first() -> None:
    arguments = {"query": "", "zone": "bad zone!", "k": 0, "limit": 5, "top_k": 3, "mode": "fuzzy",
                 "filters": {"team": "a\x00"}, "boost": "yes"}
    with pytest.raises(InvalidQueryError) as info:
        parse_request(arguments, settings=QuerySettings())
    assert str(info.value).split("; ") == [
        "unknown search argument(s) 'limit', 'top_k'",
        "the task takes " + ", ".join(WIRE_ARGUMENTS),
        "query must be a non-empty string, got ''",
        "zone 'bad zone!' is not a zone name: 1 to 128 letters, digits, '_', '.' or '-', starting with a letter or "
        "digit",
        "k must be an integer from 1 to 1000, got 0",
        "unknown mode 'fuzzy'",
        "choose one of hybrid, keyword, semantic, grep",
        "filter 'team' contains a NUL character at index 1: remove it",
        "boost must be true, false or null, got 'yes'",
    ]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"zone": "z"}, "query must be a non-empty string, got nothing"),
        ({"query": "q"}, "zone must be a zone name, got nothing"),
        ({"query": "q", "zone": "z", "alpha": float("nan")}, "alpha must be a number from 0 to 1, got nan"),
        ({"query": "q", "zone": "z", "rrf_k": 1.5}, "rrf_k must be a positive integer, got 1.5"),
        ({"query": "q", "zone": "z", "path_prefix": 7}, "path_prefix must be a non-empty string, got 7"),
        ({"query": "q", "zone": "z", "filters": {"a": None}},
         "filters must be a map of metadata keys to strings, numbers or booleans, got {'a': None}"),
        ({"query": "q", "zone": "z", "filters": {"a": float("inf")}},
         "filter 'a' is inf; a filter value must be a finite number"),
        ({"query": "q", "zone": "z", "model": 5}, "model 5 is not an embedding model name"),
    ],
)
def test_each_argument_is_named_with_what_it_must_be(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidQueryError) as info:
        parse_request(arguments, settings=QuerySettings())
    assert str(info.value) == message


def test_cache_counts_by_its_truth_as_the_task_always_took_it() -> None:
    for value, expected in ((True, True), (1, True), ("yes", True), (False, False), (0, False), (None, False)):
        assert parse_request({"query": "q", "zone": "z", "cache": value}, settings=QuerySettings()).cache is expected


def test_a_request_is_immutable() -> None:
    request = SearchRequest(query="q", zone="z")
    with pytest.raises(Exception, match="frozen"):
        request.k = 20  # type: ignore[misc]
