from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardfuse.query.router import MAX_LEAN, MAX_LIMIT_MULTIPLIER, NEUTRAL, Route, extract_features, route


def _assert_bounds(result: Route) -> None:
    assert 0.0 <= result.complexity <= 1.0
    assert 1.0 <= result.limit_multiplier <= MAX_LIMIT_MULTIPLIER
    for weight in (result.keyword_weight, result.vector_weight):
        assert 1.0 - MAX_LEAN - 1e-9 <= weight <= 1.0 + MAX_LEAN + 1e-9
    assert result.keyword_weight + result.vector_weight == pytest.approx(2.0)
    assert 0.0 < result.alpha < 1.0


@pytest.mark.parametrize(
    "query",
    [
        "bm25 vs pgvector",
        "BM25 versus dense retrieval",
        "compare RRF and convex fusion",
        "what is the difference between a shard and a zone",
        "is HNSW better than IVFFlat for small tables",
        "is the keyword leg more accurate than the vector leg",
        "pros and cons of binary COPY",
    ],
)
def test_comparison_is_detected(query: str) -> None:
    assert extract_features(query).comparison


@pytest.mark.parametrize(
    "query",
    [
        "chunks published before the last rebuild",
        "what changed since the tokenizer moved to code-v1",
        "embedding models released in 2019",
        "the latest manifest of a shard",
        "when does a worker drop its index handle",
        "dead letters from last week",
    ],
)
def test_temporal_is_detected(query: str) -> None:
    assert extract_features(query).temporal


@pytest.mark.parametrize(
    "query",
    [
        "how many shards does a zone have",
        "list all tasks that retry on TransientError",
        "count the chunks per document",
        "total number of tokens embedded",
        "average chunk size in tokens",
        "top 10 largest files",
    ],
)
def test_aggregation_is_detected(query: str) -> None:
    assert extract_features(query).aggregation


@pytest.mark.parametrize(
    "query",
    [
        "find the shard for a zone and then read its manifest",
        "which worker owns the queue that receives embedding batches",
        "what does the publisher send and why does it retry?",
        "how do SearchService, LexicalShardReader and ContentStore share a connection pool",
    ],
)
def test_multi_hop_is_detected(query: str) -> None:
    assert extract_features(query).multi_hop


def test_a_plain_query_has_none_of_the_complexity_signals() -> None:
    features = extract_features("reciprocal rank fusion")
    assert not (features.comparison or features.temporal or features.aggregation or features.multi_hop)
    assert route("reciprocal rank fusion").limit_multiplier == 1.0


@pytest.mark.parametrize(
    ("query", "identifiers"),
    [
        ("parse_event", 1),
        ("SearchService", 1),
        ("getUserId", 1),
        ("os.path.join", 1),
        ("pipeline/index/lexical/tokenizer.py", 1),
        ("MAX_QUERY_CHARS", 1),
        ("where is foo() called", 1),
        ("parse_event calls SearchService.search", 2),
    ],
)
def test_identifier_like_tokens_are_counted_and_lean_keyword(query: str, identifiers: int) -> None:
    result = route(query)
    assert result.features.identifiers == identifiers
    assert result.keyword_weight > 1.0 > result.vector_weight


def test_prose_abbreviations_and_plurals_are_not_code() -> None:
    features = extract_features("e.g. the tokenizer(s), i.e. this one")
    assert features.identifiers == 0 and not features.code_symbols


def test_quoted_phrases_and_code_symbols_lean_keyword() -> None:
    quoted = route('"exact phrase" boost')
    assert quoted.features.quoted_phrases == 1
    assert quoted.keyword_weight > quoted.vector_weight
    code = route("chunk -> row")
    assert code.features.code_symbols
    assert code.keyword_weight > code.vector_weight
    # an apostrophe opens no quoted phrase
    assert extract_features("the document's user's chunks").quoted_phrases == 0


def test_a_long_natural_question_leans_vector() -> None:
    result = route("how are a document's old chunks replaced atomically when the new version is published?")
    assert result.features.question
    assert result.vector_weight > 1.0 > result.keyword_weight


def test_a_complex_query_fetches_more_than_a_simple_one() -> None:
    simple = route("gitignore")
    complex_ = route(
        "Which worker handles the shard that stores chunks published after the latest rebuild, "
        "and then how many chunks does it hold compared to the other shards?"
    )
    assert simple.limit_multiplier == 1.0 and simple.complexity == 0.0
    assert complex_.complexity > 0.7
    assert complex_.limit_multiplier > 2.0 > simple.limit_multiplier


def test_complexity_grows_with_each_signal() -> None:
    base = route("chunks of a document").complexity
    assert route("chunks of a document vs a file").complexity > base
    assert route("chunks of a document since 2019").complexity > base
    assert route("how many chunks of a document").complexity > base


ODD_QUERIES = ["", "   \n\t ", "?", "日本語のクエリ", "Ünïcödé ß straße 🙂", "\x00\x01", "''''\"\"``", "((((", "____"]


@pytest.mark.parametrize("query", ODD_QUERIES)
def test_odd_input_is_routed_within_bounds(query: str) -> None:
    _assert_bounds(route(query))


def test_empty_query_is_neutral() -> None:
    assert route("") == NEUTRAL
    assert NEUTRAL.alpha == 0.5 and NEUTRAL.limit_multiplier == 1.0


def test_a_query_at_the_length_limit_is_routed() -> None:
    long_query = ("which shard holds parse_event and then how many chunks since 2019? " * 80)[:4096]
    result = route(long_query)
    _assert_bounds(result)
    assert result.complexity == pytest.approx(1.0 - 0.20)  # everything but a comparison
    _assert_bounds(route("a" * 4096))
    _assert_bounds(route("a_" * 2048))


CUES = ["vs", "compare", "since", "2019", "how", "many", "which", "that", "and", "then", "parse_event", "Foo",
        "x.y", "f()", '"', "?", "the", "->", "fusion"]


@given(st.text(max_size=400))
def test_bounds_hold_for_any_text(query: str) -> None:
    _assert_bounds(route(query))


@given(st.lists(st.sampled_from(CUES), max_size=60).map(" ".join))
def test_bounds_hold_for_cue_heavy_queries(query: str) -> None:
    _assert_bounds(route(query))
