"""The request fields of issue 22 (item 5): several zones, score and similarity thresholds, per-leg depths,
answers without text. Each bad value is refused in words naming its argument."""

from __future__ import annotations

import pytest

from shardfuse.pipeline.config.settings import QuerySettings, ZoneProfile
from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.query.request import MAX_ZONES, SearchRequest, parse_request


def _parse(settings: QuerySettings | None = None, **arguments: object) -> SearchRequest:
    return parse_request({"query": "retry backoff", **arguments}, settings=settings or QuerySettings())


def _refused(**arguments: object) -> str:
    with pytest.raises(InvalidQueryError) as info:
        _parse(**arguments)
    return str(info.value)


def test_one_zone_or_several_and_zone_is_always_the_first() -> None:
    one = _parse(zone="docs")
    assert (one.zone, one.zones) == ("docs", ("docs",))
    several = _parse(zones=["docs", "code"])
    assert (several.zone, several.zones) == ("docs", ("docs", "code"))
    # A request built in code fills one from the other too, and its dump (the cache key) reads back the same.
    built = SearchRequest(query="q", zones=("a", "b"))
    assert built.zone == "a" and SearchRequest.model_validate(built.model_dump()) == built


def test_several_zones_take_the_first_zone_s_fusion_defaults() -> None:
    settings = QuerySettings(zone_profiles={"code": ZoneProfile(fusion="weighted", alpha=0.2)})
    request = _parse(settings, zones=["code", "docs"])
    assert (request.fusion.value, request.alpha) == ("weighted", 0.2)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"zone": "a", "zones": ["a", "b"]}, "name the zone with zone or zones, not both"),
        ({"zones": []}, f"zones must be a list of 1 to {MAX_ZONES} zone names, got []"),
        ({"zones": "docs"}, f"zones must be a list of 1 to {MAX_ZONES} zone names, got 'docs'"),
        ({"zones": [f"z{i}" for i in range(MAX_ZONES + 1)]}, f"zones must be a list of 1 to {MAX_ZONES} zone names"),
        ({"zones": ["a", "b", "a"]}, "zones name 'a' more than once; name each zone once"),
        ({"zones": ["a", "no such/zone"]}, "zones[1] 'no such/zone' is not a zone name"),
        ({}, "zone must be a zone name, got nothing"),
    ],
)
def test_bad_zone_lists_are_refused_in_words(arguments: dict[str, object], message: str) -> None:
    assert message in _refused(**arguments)


def test_a_bad_first_zone_is_reported_once_under_the_name_the_caller_used() -> None:
    message = _refused(zones=["bad zone", "b"])
    assert message.startswith("zones[0] 'bad zone' is not a zone name") and "zone 'bad zone'" not in message


def test_thresholds_depths_and_text_are_taken_and_checked() -> None:
    request = _parse(zone="z", min_score=0.02, min_similarity=-0.25, keyword_depth=5, vector_depth=200,
                     include_text=False)
    assert (request.min_score, request.min_similarity, request.keyword_depth, request.vector_depth,
            request.include_text) == (0.02, -0.25, 5, 200, False)
    defaults = _parse(zone="z")
    assert (defaults.min_score, defaults.min_similarity, defaults.keyword_depth, defaults.vector_depth,
            defaults.include_text) == (None, None, None, None, True)
    assert _refused(zone="z", min_score=-0.1, min_similarity=1.5, keyword_depth=0, vector_depth=1001,
                    include_text="no").split("; ") == [
        "min_score must be a number of at least 0, got -0.1",
        "min_similarity must be a number from -1 to 1, got 1.5",
        "keyword_depth must be an integer from 1 to 1000, got 0",
        "vector_depth must be an integer from 1 to 1000, got 1001",
        "include_text must be true or false, got 'no'",
    ]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "0.5", True])
def test_a_threshold_must_be_a_finite_number(value: object) -> None:
    assert "min_score must be a number of at least 0" in _refused(zone="z", min_score=value)


def test_the_per_file_cap_is_taken_checked_and_refused_for_grep() -> None:
    assert _parse(zone="z", max_per_file=1).max_per_file == 1
    assert _parse(zone="z", max_per_file=0).max_per_file == 0  # no cap
    assert _parse(zone="z").max_per_file is None  # query.max_chunks_per_file
    assert _refused(zone="z", max_per_file=-1) == "max_per_file must be an integer of at least 0, got -1"
    assert _refused(zone="z", max_per_file=1.5) == "max_per_file must be an integer of at least 0, got 1.5"
    assert _refused(zone="z", mode="grep", max_per_file=1) == (
        "max_per_file does not apply to mode 'grep', whose results are lines")


def test_the_depth_bound_follows_the_settings() -> None:
    settings = QuerySettings(max_leg_depth=50)
    assert _parse(settings, zone="z", vector_depth=50).vector_depth == 50
    with pytest.raises(InvalidQueryError, match="vector_depth must be an integer from 1 to 50, got 51"):
        _parse(settings, zone="z", vector_depth=51)
