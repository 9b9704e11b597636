from __future__ import annotations

from typing import Any

import pytest

from shardfuse.pipeline.config.settings import BoostSettings
from shardfuse.query.boosts import Boost, Candidate, boost, prepare_query, rerank

DEFAULTS = BoostSettings()
# Only the field factor: exactness and symbol bonuses switched off.
FIELDS_ONLY = BoostSettings(exact_phrase=1.0, prefix=1.0, primary_symbol=0, any_symbol=0, complete_role=0,
                            declaration_role=0)
# Only exactness.
EXACT_ONLY = BoostSettings(filename=1.0, title=1.0, path=1.0, tags=1.0, description=1.0, primary_symbol=0,
                           any_symbol=0, complete_role=0, declaration_role=0)
# Only symbols.
SYMBOLS_ONLY = BoostSettings(filename=1.0, title=1.0, path=1.0, tags=1.0, description=1.0, exact_phrase=1.0,
                             prefix=1.0)


def candidate(
    path: str = "docs/notes.md",
    text: str = "nothing relevant here",
    metadata: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Candidate:
    return Candidate(path=path, text=text, metadata=metadata or {}, **kwargs)


def factor(query: str, cand: Candidate, settings: BoostSettings = DEFAULTS) -> Boost:
    return boost(prepare_query(query), cand, settings)


def assert_boost(result: Boost, expected_factor: float, *reasons: str) -> None:
    assert result.factor == pytest.approx(expected_factor)
    assert result.reasons == reasons


# --- field factor -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cand", "expected", "reason"),
    [
        (candidate(path="query/fusion_rank.py"), 3.0, "filename:1.00"),  # 1 + (3.0 - 1) · 1
        (candidate(metadata={"title": "Rank fusion methods"}), 2.5, "title:1.00"),
        (candidate(path="rank/fusion/readme.md"), 2.0, "path:1.00"),
        (candidate(metadata={"tags": ["fusion", "rank"]}), 2.0, "tags:1.00"),
        (candidate(metadata={"tags": "rank, fusion"}), 2.0, "tags:1.00"),  # a comma-separated string
        (candidate(metadata={"description": "How rank fusion works"}), 1.5, "description:1.00"),
    ],
)
def test_each_field_scores_its_weight_on_full_coverage(cand: Candidate, expected: float, reason: str) -> None:
    result = factor("rank fusion", cand, FIELDS_ONLY)
    assert result.factor == pytest.approx(expected)
    assert result.reasons == (reason,)


def test_fields_in_other_scripts_and_cases_are_covered_like_ascii_ones() -> None:
    # Field texts are only tokenized when a query term can be in them; that shortcut must not lose a match
    # whatever the script or case of the field.
    assert factor("Überblick KAFKA", candidate(metadata={"title": "KAFKA überblick"}), FIELDS_ONLY).reasons == (
        "title:1.00",)
    assert factor("fusion", candidate(path="docs/RRF_Fusion.md"), FIELDS_ONLY).reasons == ("filename:1.00",)
    assert factor("σύνοψη", candidate(metadata={"title": "Σύνοψη"}), FIELDS_ONLY).reasons == ("title:1.00",)
    assert factor("kafka", candidate(metadata={"title": "rabbitmq"}), FIELDS_ONLY).reasons == ()


def test_prefix_skips_leading_punctuation_and_ignores_case() -> None:
    assert factor("rank fusion", candidate(text="## Rank  Fusion, explained"), EXACT_ONLY) == Boost(1.5, (
        "exact_phrase",))
    assert factor("Rank fus", candidate(text="  -- RANK FUSION explained"), EXACT_ONLY) == Boost(1.2, ("prefix",))
    assert factor("rank fus", candidate(text="ranking fusion"), EXACT_ONLY).factor == 1.0


def test_partial_coverage_scales_toward_one() -> None:
    # "reciprocal rank fusion": 3 distinct terms; the title has 1 of them → 1 + 1.5 · 1/3
    result = factor("reciprocal rank fusion", candidate(metadata={"title": "Fusion"}), FIELDS_ONLY)
    assert result.factor == pytest.approx(1.5)
    assert result.reasons == ("title:0.33",)
    # 2 of 3 in the filename → 1 + 2.0 · 2/3
    assert factor("reciprocal rank fusion", candidate(path="q/rank_fusion.py"), FIELDS_ONLY).factor == (
        pytest.approx(1 + 2 * 2 / 3)
    )


def test_the_field_factor_is_the_best_field_not_the_product() -> None:
    everywhere = candidate(
        path="rank/fusion/rank_fusion.py",
        metadata={"title": "Rank fusion", "tags": ["rank", "fusion"], "description": "rank fusion"},
    )
    assert factor("rank fusion", everywhere, FIELDS_ONLY).factor == pytest.approx(3.0)
    # a strong partial field still loses to a full weaker one: filename 1/2 → 2.0 < title 1/1 → 2.5
    mixed = candidate(path="src/fusion.py", metadata={"title": "rank fusion"})
    assert factor("rank fusion", mixed, FIELDS_ONLY).reasons == ("title:1.00",)


def test_content_never_boosts_by_default_and_a_weight_of_one_is_off() -> None:
    cand = candidate(path="x/rank_fusion.py", text="rank fusion")
    assert factor("rank fusion", candidate(text="rank fusion"), FIELDS_ONLY).factor == 1.0
    content_on = BoostSettings(content=2.0, exact_phrase=1.0, prefix=1.0)
    assert factor("rank fusion", candidate(text="rank fusion"), content_on).factor == pytest.approx(2.0)
    filename_off = FIELDS_ONLY.model_copy(update={"filename": 1.0})
    assert factor("rank fusion", cand, filename_off) == Boost(1.0, ())


def test_stopwords_do_not_count_and_terms_are_not_stemmed() -> None:
    # "the" and "of" are stopwords: the query has two terms, both in the title
    assert factor("the rank of fusion", candidate(metadata={"title": "fusion rank"}), FIELDS_ONLY).factor == (
        pytest.approx(2.5)
    )
    # no stemming: "chunks" does not cover "chunk"
    assert factor("chunks", candidate(metadata={"title": "chunk"}), FIELDS_ONLY).factor == 1.0
    # a query of stopwords only has no terms, so no field can cover it
    assert factor("the of", candidate(metadata={"title": "the of"}), FIELDS_ONLY).factor == 1.0


def test_an_identifier_query_is_covered_by_its_parts() -> None:
    # parse_event → terms {parse, event}; a title that says them in prose covers it fully
    assert factor("parse_event", candidate(metadata={"title": "Parse an event"}), FIELDS_ONLY).factor == (
        pytest.approx(2.5)
    )
    assert factor("parseEvent", candidate(path="events/parse_event.py"), FIELDS_ONLY).factor == pytest.approx(3.0)


# --- exactness ----------------------------------------------------------------------------------------


def test_exact_phrase_anywhere_in_text_title_or_filename() -> None:
    query = "old chunks replaced"
    in_text = candidate(text="We keep the OLD   chunks\nreplaced atomically.")  # case and whitespace folded
    in_title = candidate(metadata={"title": "When old chunks replaced"})
    assert factor(query, in_text, EXACT_ONLY) == Boost(1.5, ("exact_phrase",))
    assert factor(query, in_title, EXACT_ONLY) == Boost(1.5, ("exact_phrase",))
    assert factor("fusion rank", candidate(path="q/fusion rank.py"), EXACT_ONLY).reasons == ("exact_phrase",)
    # whole words only: "old chunk" is not in "old chunks", nor "old chunks" in "bold chunks"
    assert factor("old chunk", in_text, EXACT_ONLY).factor == 1.0
    assert factor("old chunks", candidate(text="a bold chunks store"), EXACT_ONLY).factor == 1.0
    assert factor("old chunks", candidate(text="bold chunks, then old, chunks"), EXACT_ONLY).factor == 1.5
    # the description is not an exactness field
    assert factor(query, candidate(metadata={"description": query}), EXACT_ONLY).factor == 1.0


def test_prefix_is_the_first_two_words_the_second_possibly_unfinished() -> None:
    title = candidate(metadata={"title": "Reciprocal rank fusion in practice"})
    assert factor("reciprocal rank fus", title, EXACT_ONLY) == Boost(1.2, ("prefix",))
    assert factor("reciprocal rank weights", title, EXACT_ONLY) == Boost(1.2, ("prefix",))  # first two agree
    assert factor("rank fus", title, EXACT_ONLY).factor == 1.0  # not where the field starts
    assert factor("reci rank", title, EXACT_ONLY).factor == 1.0  # only the last needed word may be unfinished


def test_a_one_word_query_is_a_prefix_of_the_first_word_and_never_an_exact_phrase() -> None:
    assert factor("pars", candidate(path="src/parser.py"), EXACT_ONLY) == Boost(1.2, ("prefix",))
    assert factor("parser", candidate(text="parser reads tokens"), EXACT_ONLY) == Boost(1.2, ("prefix",))
    assert factor("parser", candidate(text="the parser reads tokens"), EXACT_ONLY).factor == 1.0


def test_exact_and_prefix_are_exclusive() -> None:
    # starts with the query and contains it: exact only
    cand = candidate(text="rank fusion: rank fusion is simple")
    assert factor("rank fusion", cand, EXACT_ONLY) == Boost(1.5, ("exact_phrase",))


def test_exactness_multiplies_the_field_factor() -> None:
    cand = candidate(metadata={"title": "Rank fusion"})
    assert factor("rank fusion", cand, DEFAULTS) == Boost(2.5 * 1.5, ("title:1.00", "exact_phrase"))


# --- symbols ------------------------------------------------------------------------------------------


def test_primary_symbol_bonus_and_role() -> None:
    cand = candidate(symbols=("parse_event", "Event"), primary_symbol="parse_event", role="complete")
    assert_boost(
        factor("where is parse_event", cand, SYMBOLS_ONLY), 1.0 + 0.25 + 0.10,
        "primary_symbol:parse_event", "complete_role",
    )


def test_any_symbol_only_when_the_primary_did_not_match() -> None:
    cand = candidate(symbols=("Reader", "parse_event"), primary_symbol="Reader", role="declaration")
    assert_boost(
        factor("parse_event", cand, SYMBOLS_ONLY), 1.0 + 0.15 + 0.05, "any_symbol:parse_event", "declaration_role"
    )


def test_role_bonus_needs_a_symbol_match() -> None:
    cand = candidate(symbols=("Reader",), primary_symbol="Reader", role="complete")
    assert factor("parse_event", cand, SYMBOLS_ONLY) == Boost(1.0, ())
    assert factor("parse_event", candidate(role="complete"), SYMBOLS_ONLY) == Boost(1.0, ())


def test_symbols_match_across_naming_conventions_and_in_prose() -> None:
    snake = candidate(primary_symbol="parse_event")
    for query in ("parseEvent", "ParseEvent", "PARSE_EVENT", "how do we parse event payloads"):
        assert factor(query, snake, SYMBOLS_ONLY).factor == pytest.approx(1.25), query
    # a qualified name is matched by its last segment; a term matches a one-part symbol
    assert factor("search", candidate(primary_symbol="SearchService.search"), SYMBOLS_ONLY).factor == 1.25
    assert factor("parse", snake, SYMBOLS_ONLY).factor == 1.0  # only part of the symbol
    assert factor("parse_event_batch", candidate(primary_symbol="event_batch"), SYMBOLS_ONLY).factor == 1.25
    assert factor("str type", candidate(primary_symbol="type"), SYMBOLS_ONLY).factor == 1.0  # a stopword


def test_symbol_bonus_is_added_to_the_multiplied_factor() -> None:
    cand = candidate(path="events/parse_event.py", primary_symbol="parse_event", role="complete")
    # filename fully covered (3.0) × prefix (the filename opens with the one-word query) + 0.25 + 0.10
    assert_boost(
        factor("parse_event", cand), 3.0 * 1.2 + 0.25 + 0.10,
        "filename:1.00", "prefix", "primary_symbol:parse_event", "complete_role",
    )


# --- switched off, and reranking ----------------------------------------------------------------------


def test_disabled_is_identity() -> None:
    off = BoostSettings(enabled=False)
    cand = candidate(path="q/rank_fusion.py", text="rank fusion", primary_symbol="rank_fusion", role="complete")
    assert factor("rank fusion", cand, off) == Boost(1.0, ())
    hits = [("a", 0.3), ("b", 0.2), ("c", 0.1)]
    ranked = rerank(hits, query_terms=prepare_query("rank fusion"), candidate_of=lambda h: cand,
                    score_of=lambda h: h[1], settings=off)
    assert [(hit, score) for hit, score, _ in ranked] == [(h, h[1]) for h in hits]


def test_rerank_orders_by_boosted_score_and_keeps_ties_in_order() -> None:
    plain = candidate()
    titled = candidate(metadata={"title": "rank fusion"})
    hits = [("a", 1.0, plain), ("b", 0.5, titled), ("c", 1.0, plain), ("d", 1.0, plain)]
    ranked = rerank(hits, query_terms=prepare_query("rank fusion"), candidate_of=lambda h: h[2],
                    score_of=lambda h: h[1], settings=FIELDS_ONLY)
    assert [hit[0] for hit, _, _ in ranked] == ["b", "a", "c", "d"]  # 0.5 × 2.5 = 1.25 first
    assert ranked[0][1] == pytest.approx(1.25)
    assert ranked[0][2] == Boost(2.5, ("title:1.00",))
    assert rerank([], query_terms=prepare_query("x"), candidate_of=lambda h: plain, score_of=lambda h: 0.0,
                  settings=DEFAULTS) == []


def test_an_empty_query_boosts_nothing() -> None:
    cand = candidate(path="a/b.py", metadata={"title": "t"}, primary_symbol="b", role="complete")
    assert factor("", cand) == Boost(1.0, ())
    assert factor("   ", cand) == Boost(1.0, ())
