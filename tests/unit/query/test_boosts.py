from __future__ import annotations

from typing import Any

import pytest

from shardfuse.pipeline.config.settings import BoostSettings
from shardfuse.query.boosts import Boost, Candidate, boost, prepare_query, rerank

DEFAULTS = BoostSettings()
# Only the field factor: exactness and symbol bonuses switched off.
FIELDS_ONLY = BoostSettings(exact_phrase=1.0, prefix=1.0, primary_symbol=0, any_symbol=0, complete_role=0,
                            declaration_role=0, definitions_first=False)
# Only exactness.
EXACT_ONLY = BoostSettings(filename=1.0, title=1.0, path=1.0, tags=1.0, description=1.0, primary_symbol=0,
                           any_symbol=0, complete_role=0, declaration_role=0, definitions_first=False)
# Only the symbol bonuses.
SYMBOLS_ONLY = BoostSettings(filename=1.0, title=1.0, path=1.0, tags=1.0, description=1.0, exact_phrase=1.0,
                             prefix=1.0, definitions_first=False)
# Symbol bonuses and the definition factor.
DEFINITIONS = BoostSettings(filename=1.0, title=1.0, path=1.0, tags=1.0, description=1.0, exact_phrase=1.0,
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


# --- a bare name: its definition first -----------------------------------------------------------------


def _definition_ranking(query: str, settings: BoostSettings = DEFINITIONS) -> list[str]:
    """The boosted order of five equally fused chunks of one file around the name ``open_channel``, listed in
    the order BM25 might give them (the heaviest users of the name first)."""
    chunks = {
        "caller": candidate(text="open_channel(); open_channel()", symbols=("reconnect",), primary_symbol="reconnect",
                            role="complete"),
        "partial": candidate(symbols=("_open_channel",), primary_symbol="_open_channel", role="complete"),
        "body": candidate(primary_symbol="open_channel", role="body"),
        "declaration": candidate(symbols=("open_channel",), primary_symbol="open_channel", role="declaration"),
        "complete": candidate(symbols=("open_channel",), primary_symbol="open_channel", role="complete"),
        "method": candidate(symbols=("Pool", "open_channel", "close"), primary_symbol="Pool", role="mixed"),
    }
    ranked = rerank(list(chunks), query_terms=prepare_query(query), candidate_of=chunks.__getitem__,
                    score_of=lambda _: 1.0, settings=settings)
    return [name for name, _, _ in ranked]


@pytest.mark.parametrize("query", ["open_channel", "Pool.open_channel", "open_channel()", " OPEN_CHANNEL "])
def test_a_bare_name_ranks_complete_definition_then_declaration_then_body_then_use(query: str) -> None:
    order = _definition_ranking(query)
    assert order[:2] == ["complete", "declaration"]
    assert order.index("method") < order.index("body") < order.index("caller")
    assert order.index("body") < order.index("partial")  # "_open_channel" is another name


def test_a_definition_outranks_a_use_that_fusion_put_far_ahead() -> None:
    definition = candidate(symbols=("open_channel",), primary_symbol="open_channel", role="complete")
    use = candidate(text="open_channel() open_channel()", primary_symbol="reconnect", symbols=("reconnect",),
                    role="complete")
    hits = [("use", 1.0, use), ("definition", 0.4, definition)]
    ranked = rerank(hits, query_terms=prepare_query("open_channel"), candidate_of=lambda h: h[2],
                    score_of=lambda h: h[1], settings=DEFAULTS)
    assert [hit[0] for hit, _, _ in ranked] == ["definition", "use"]
    assert ranked[0][2].reasons[0] == "defines:open_channel"


def test_the_name_in_the_query_s_case_comes_before_the_same_name_in_another_case_and_both_before_a_use() -> None:
    chunks = {
        "use": candidate(text="request = Request(url)", symbols=("fetch",), primary_symbol="fetch", role="complete"),
        "class": candidate(symbols=("Request",), primary_symbol="Request", role="complete"),
        "method": candidate(symbols=("Client", "request"), primary_symbol="Client", role="mixed"),
    }
    for query, expected in (("request", ["method", "class", "use"]), ("Request", ["class", "method", "use"])):
        ranked = rerank(list(chunks), query_terms=prepare_query(query), candidate_of=chunks.__getitem__,
                        score_of=lambda _: 1.0, settings=DEFINITIONS)
        assert [name for name, _, _ in ranked] == expected, query


@pytest.mark.parametrize("query", ["how is open_channel retried", "open_channel close", "open channel"])
def test_more_than_a_name_gets_no_definition_factor(query: str) -> None:
    definition = candidate(symbols=("open_channel",), primary_symbol="open_channel", role="complete")
    assert factor(query, definition, DEFINITIONS).factor == factor(query, definition, SYMBOLS_ONLY).factor


def test_definitions_first_can_be_switched_off() -> None:
    complete = candidate(symbols=("open_channel",), primary_symbol="open_channel", role="complete")
    partial = candidate(symbols=("_open_channel",), primary_symbol="_open_channel", role="complete")
    assert (factor("open_channel", complete, DEFINITIONS).tier, factor("open_channel", partial, DEFINITIONS).tier) \
        == (4, 0)
    # Off, only the symbol bonuses are left, and they cannot tell the name from a longer one.
    off = (factor("open_channel", complete, SYMBOLS_ONLY), factor("open_channel", partial, SYMBOLS_ONLY))
    assert [b.tier for b in off] == [0, 0]
    assert off[0].factor == off[1].factor


def test_lifted_scores_still_fall_with_the_rank() -> None:
    definition = candidate(symbols=("open_channel",), primary_symbol="open_channel", role="complete")
    body = candidate(primary_symbol="open_channel", role="body")
    use = candidate(text="conn = open_channel()")
    hits = [("use", 0.9, use), ("definition", 0.0, definition), ("body", 0.1, body), ("use2", 0.5, use)]
    ranked = rerank(hits, query_terms=prepare_query("open_channel"), candidate_of=lambda h: h[2],
                    score_of=lambda h: h[1], settings=DEFAULTS)
    assert [hit[0] for hit, _, _ in ranked] == ["definition", "body", "use", "use2"]
    scores = [score for _, score, _ in ranked]
    assert scores == sorted(scores, reverse=True)
    assert scores[2:] == [0.9, 0.5]  # the tier-0 hits keep their (unboosted here) scores


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
