"""Bad input on the query side (issue 6, "Bad input"): every malformed request gets an
:class:`InvalidQueryError` that says what to change, before any shard is touched; a well-formed request
for something that is not there gets an empty answer.

``tests/unit/query/test_search_service.py`` pins a sample of invalid requests; this file covers the matrix
(empty, 100 KB, k of 0 and 10**6, unknown mode, unknown and malformed zones, odd Unicode) with the exact
wording, the RPC task's own argument handling, the CLI's, and the keyword leg's real tokenizer and BM25
index on odd Unicode.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from shardfuse.pipeline.config.settings import QuerySettings
from shardfuse.pipeline.core.errors import InvalidQueryError, PermanentError
from shardfuse.pipeline.embed.providers import HashingEmbedder
from shardfuse.pipeline.index.lexical import LexicalShardReader, build_shard_index
from shardfuse.pipeline.index.lexical.stats import TermStats
from shardfuse.pipeline.index.store import ChunkFilter, ChunkRecord
from shardfuse.query.request import MAX_QUERY_CHARS, SearchRequest, parse_request
from shardfuse.query.search import SearchService
from shardfuse.query.shard_legs import LegHit

MAX_K = QuerySettings().max_k  # 1000


def _parse(**overrides: object) -> SearchRequest:
    args: dict[str, object] = {"query": "q", "zone": "z", "k": 10, "mode": "hybrid", "fusion": "rrf", **overrides}
    return parse_request(args, settings=QuerySettings())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # empty
        ({"query": ""}, "query must be a non-empty string"),
        ({"query": "   \t\n"}, "query must be a non-empty string"),
        ({"query": "\u3000\u00a0"}, "query must be a non-empty string"),
        ({"query": None}, "query must be a non-empty string"),
        ({"query": 42}, "query must be a non-empty string"),
        ({"query": ["q"]}, "query must be a non-empty string"),
        # too long
        ({"query": "x" * 102_400}, "query is 102,400 characters; the limit is 4,096: shorten it"),
        ({"query": "word " * 20_480}, "query is 102,400 characters; the limit is 4,096: shorten it"),
        ({"query": "q" * (MAX_QUERY_CHARS + 1)}, "query is 4,097 characters; the limit is 4,096"),
        # k
        ({"k": 0}, "k must be an integer from 1 to 1000, got 0"),
        ({"k": -1}, "k must be an integer from 1 to 1000, got -1"),
        ({"k": 10**6}, "k must be an integer from 1 to 1000, got 1000000"),
        ({"k": MAX_K + 1}, "k must be an integer from 1 to 1000, got 1001"),
        ({"k": 10**100}, "k must be an integer from 1 to 1000, got 1000000000000000000000000000000000000000000"),
        ({"k": "10"}, "k must be an integer from 1 to 1000, got '10'"),
        ({"k": 10.0}, "k must be an integer from 1 to 1000, got 10.0"),
        ({"k": True}, "k must be an integer from 1 to 1000, got True"),
        ({"k": None}, "k must be an integer from 1 to 1000, got None"),
        # mode
        ({"mode": "fuzzy"}, "unknown mode 'fuzzy'; choose one of hybrid, keyword, semantic"),
        ({"mode": "HYBRID"}, "unknown mode 'HYBRID'; choose one of hybrid, keyword, semantic"),
        ({"mode": ""}, "unknown mode ''; choose one of"),
        ({"mode": None}, "unknown mode None; choose one of"),
        ({"mode": ["keyword"]}, "unknown mode ['keyword']; choose one of"),
        # malformed zone (a well-formed zone nobody wrote to is not an error: see below)
        ({"zone": ""}, "zone '' is not a zone name: 1 to 128 letters, digits, '_', '.' or '-', starting with a "
                       "letter or digit"),
        ({"zone": "bad zone!"}, "zone 'bad zone!' is not a zone name"),
        ({"zone": "../etc"}, "zone '../etc' is not a zone name"),
        ({"zone": "z\n"}, "zone 'z\\n' is not a zone name"),
        ({"zone": "z" * 129}, "is not a zone name"),
        ({"zone": None}, "zone None is not a zone name"),
        ({"zone": 7}, "zone 7 is not a zone name"),
        # characters no shard, cache or embedder can take
        ({"query": "caf\ud800"},
         "query contains a lone surrogate U+D800 at index 3, which is not valid Unicode: remove it"),
        ({"query": "a\x00b"}, "query contains a NUL character at index 1: remove it"),
        ({"path_prefix": "src/\x00"}, "path_prefix contains a NUL character at index 4: remove it"),
        ({"path_prefix": "\udcff/"}, "path_prefix contains a lone surrogate U+DCFF at index 0"),
        ({"filters": {"team": "a\x00"}}, "filter 'team' contains a NUL character at index 1: remove it"),
        ({"filters": {"t\ud800": "a"}}, "a filter key contains a lone surrogate U+D800 at index 1"),
        ({"filters": {"score": float("nan")}}, "filter 'score' is nan; a filter value must be a finite number"),
    ],
)
def test_bad_requests_are_invalid_queries_saying_what_to_change(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidQueryError) as info:
        _parse(**overrides)
    assert message in str(info.value), str(info.value)
    assert isinstance(info.value, PermanentError)


def test_messages_quote_a_huge_bad_value_briefly() -> None:
    for overrides in ({"mode": "m" * 100_000}, {"zone": "z z" * 50_000}, {"k": "9" * 100_000}):
        with pytest.raises(InvalidQueryError) as info:
            _parse(**overrides)
        # The value is cut to 80 characters; the rest is the sentence saying what the argument must be.
        assert len(str(info.value)) < 250 and "characters)" in str(info.value), overrides


@pytest.mark.parametrize(
    "overrides",
    [{"query": "q" * MAX_QUERY_CHARS}, {"k": 1}, {"k": MAX_K}, {"zone": "never-written-to"},
     {"query": "\u202eevil\u202c name"}, {"query": "cafe\u0301 Z\u0351\u0352algo"},
     {"query": "\U0001f9d1\u200d\U0001f680"}, {"query": "???"}, {"path_prefix": "docs/\u202e"}],
    ids=["longest", "k-1", "k-max", "unknown-zone", "rtl", "combining", "emoji", "punctuation", "odd-prefix"],
)
def test_edges_that_are_valid_requests(overrides: dict[str, object]) -> None:
    request = _parse(**overrides)
    assert request.query == overrides.get("query", "q")


# --- the answer: empty where nothing matches, never an error ----------------------------------------------

class IndexedShard:
    """A shard with a real bm25s index (so the real tokenizer runs on the query) and exact vectors."""

    def __init__(self, root: Path, chunks: dict[str, tuple[str, str]], embedder: HashingEmbedder) -> None:
        self.shard = 0
        self._chunks = chunks
        build_shard_index(root, 0, chunk_ids=list(chunks), zones=[z for z, _ in chunks.values()],
                          texts=[t for _, t in chunks.values()], built_version=1)
        self._lexical = LexicalShardReader(root, 0)
        self._vectors = {cid: embedder.embed_query(text) for cid, (_, text) in chunks.items()}

    def keyword_stats(self, query: str, *, zone: str) -> TermStats:
        return self._lexical.term_stats(query, zone=zone)

    def keyword(self, query: str, *, zone: str, limit: int, where: ChunkFilter | None = None,
                stats: TermStats | None = None) -> list[LegHit]:
        return [LegHit(h.chunk_id, h.score) for h in self._lexical.search(query, zone=zone, k=limit, stats=stats)]

    def vector(self, embedding: npt.NDArray[np.float32], *, zone: str, limit: int,
               where: ChunkFilter | None = None, model: str = "default") -> list[LegHit]:
        scored = [LegHit(cid, float(np.dot(embedding, vec))) for cid, vec in self._vectors.items()
                  if self._chunks[cid][0] == zone]
        return sorted(scored, key=lambda h: -h.score)[:limit]

    def fetch(self, chunk_ids: Sequence[str], *, zone: str) -> dict[str, ChunkRecord]:
        return {cid: ChunkRecord(cid, zone, f"{cid}.txt", 1, 1, self._chunks[cid][1]) for cid in chunk_ids
                if cid in self._chunks and self._chunks[cid][0] == zone}

    def generation(self) -> int | None:
        return self._lexical.generation

    def current_index(self) -> str | None:
        return "1"


@pytest.fixture
def service(tmp_path: Path) -> SearchService:
    embedder = HashingEmbedder(64)
    chunks = {
        "rtl": ("odd", "the file \u202egnp.exe\u202c hides its extension with an override mark"),
        "combining": ("odd", "cafe\u0301 and Z\u0351\u0352\u0353algo text with combining marks"),
        "hebrew": ("odd", "\u200f\u05e9\u05dc\u05d5\u05dd means peace"),
        "plain": ("other", "a plain document in another zone"),
    }
    return SearchService(shards=[IndexedShard(tmp_path, chunks, embedder)], embedder=embedder,
                         settings=QuerySettings())


@pytest.mark.parametrize("mode", ["hybrid", "keyword", "semantic"])
def test_a_zone_nobody_wrote_to_answers_empty(service: SearchService, mode: str) -> None:
    answer = service.search(_parse(query="plain document", zone="never-written-to", mode=mode))
    assert answer["results"] == []


def test_a_query_with_no_indexable_token_answers_empty_in_keyword_mode(service: SearchService) -> None:
    assert service.search(_parse(query="??? !!!", zone="odd", mode="keyword"))["results"] == []


@pytest.mark.parametrize(
    ("query", "expected"),
    [("\u202egnp.exe\u202c", "rtl"), ("cafe\u0301", "combining"), ("\u05e9\u05dc\u05d5\u05dd", "hebrew")],
    ids=["rtl", "combining", "hebrew"],
)
def test_odd_unicode_queries_find_odd_unicode_text(service: SearchService, query: str, expected: str) -> None:
    answer = service.search(_parse(query=query, zone="odd", mode="keyword", k=1))
    assert [hit["chunk_id"] for hit in answer["results"]] == [expected]


def test_k_at_its_maximum_returns_what_the_zone_holds(service: SearchService) -> None:
    answer = service.search(_parse(query="text", zone="odd", k=MAX_K))
    assert 1 <= len(answer["results"]) <= 3 and {h["zone"] for h in answer["results"]} == {"odd"}


# --- the RPC task and the CLI -----------------------------------------------------------------------------

def test_the_search_task_names_an_unknown_argument() -> None:
    from shardfuse.workers.tasks.search import search

    with pytest.raises(InvalidQueryError, match="unknown search argument.s. 'limit'; the task takes query, zone, k"):
        search.run(query="q", zone="z", limit=5)
    with pytest.raises(InvalidQueryError, match="query must be a non-empty string"):
        search.run(zone="z")  # no query at all
    with pytest.raises(InvalidQueryError, match="k must be an integer from 1 to 1000, got 0"):
        search.run(query="q", zone="z", k=0)


def test_the_search_task_reads_the_settings_of_its_worker_runtime_when_called(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardfuse.pipeline.config.settings import Settings
    from shardfuse.workers.tasks.search import search

    holder = search.app.shardfuse_runtime
    monkeypatch.setattr(search.app, "shardfuse_runtime", type(holder)(Settings(query=QuerySettings(max_k=5))))
    with pytest.raises(InvalidQueryError, match="k must be an integer from 1 to 5, got 6"):
        search.run(query="q", zone="z", k=6)


def test_the_cli_sends_the_options_it_was_given_under_the_task_argument_names() -> None:
    from shardfuse.workers.cli.main import build_parser
    from shardfuse.workers.cli.querying import search_options

    argv = ["search", "q", "--zone", "z", "-k", "5", "--mode", "keyword", "--fusion", "weighted", "--alpha", "0.3",
            "--path-prefix", "src/", "--model", "mini", "--no-boost", "--route", "--expand"]
    assert search_options(build_parser().parse_args(argv)) == {
        "k": 5, "mode": "keyword", "fusion": "weighted", "alpha": 0.3, "path_prefix": "src/", "boost": False,
        "route": True, "expand": True, "model": "mini"}
    # Left unset, the query worker's settings decide (a zone's fusion profile, the configured stages).
    assert search_options(build_parser().parse_args(["search", "q", "--zone", "z"])) == {"k": 10, "mode": "hybrid"}
    evaluate = build_parser().parse_args(["eval", "data", "--zone", "z", "--fusion", "rrf", "--no-expand"])
    assert search_options(evaluate) == {"fusion": "rrf", "expand": False}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["search", "q", "--zone", "z", "--mode", "fuzzy"], "argument --mode: invalid choice: 'fuzzy'"),
        (["search", "q", "--zone", "z", "-k", "ten"], "argument -k: invalid int value: 'ten'"),
        (["search", "q"], "the following arguments are required: --zone"),
    ],
)
def test_the_cli_refuses_what_it_can_check_itself(argv: list[str], message: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from shardfuse.workers.cli.main import build_parser

    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
