"""Reranking through a whole stack: the query workers get ``[rerank]`` from the launcher, build the reranker
when they start, send each candidate's context and text as PostgreSQL holds them to a TEI-speaking server, and
answer in its order — or, when it fails, in the fused order with the reason."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.conftest import Stack, running_stack
from tests.support.rerank_servers import TEI_RERANK, FakeRerankServer, overlap_score, rerank_error

pytestmark = pytest.mark.integration
ZONE = "rerank"
DOCUMENTS = {
    "notes/backoff.md": "# Backoff\n\nRetries wait longer each time, capped, with jitter.\n",
    "notes/cats.md": "# Cats\n\nThe cat sat on the mat and watched the retries of the dog.\n",
    "notes/shards.md": "# Shards\n\nEvery shard is a PostgreSQL schema with its own HNSW index.\n",
}


@pytest.fixture(scope="module")
def server() -> Iterator[FakeRerankServer]:
    running = FakeRerankServer()
    with running:
        yield running


@pytest.fixture(scope="module")
def rerank_stack(server: FakeRerankServer) -> Iterator[Stack]:
    overrides = {
        "SHARDFUSE_EMBEDDER__PROVIDER": "hashing",
        "SHARDFUSE_SHARDS": "2",
        "SHARDFUSE_BM25__REBUILD_DEBOUNCE_S": "0.2",
        "SHARDFUSE_RERANK__PROVIDER": "tei",
        "SHARDFUSE_RERANK__BASE_URL": server.root_url,
        "SHARDFUSE_RERANK__BUDGET_MS": "2000",
        "SHARDFUSE_QUERY__RESULT_CACHE_TTL_S": "0",
    }
    with running_stack(overrides) as stack:
        with stack.publisher() as publisher:
            for path, text in DOCUMENTS.items():
                publisher.write(zone=ZONE, path=path, data=text.encode())
        stack.wait(timeout=180)
        yield stack


def test_the_query_worker_reranks_with_the_indexed_context(rerank_stack: Stack, server: FakeRerankServer) -> None:
    query = "shard schema retries"
    answer = rerank_stack.search(query, ZONE, mode="keyword", k=3)
    assert answer["rerank"]["applied"] is True and answer["rerank"]["model"] == "tei"
    sent = server.requests(TEI_RERANK)[-1].json["texts"]
    # Each candidate went as PostgreSQL holds it: its context (the headings context: path and title), then
    # its text.
    shards_text = next(text for text in sent if "HNSW" in text)
    assert shards_text.startswith("notes/shards.md") and "\n\n# Shards" in shards_text
    # The answer is in the server's order, with its scores.
    got = [next(text for text in sent if text.endswith(r["text"])) for r in answer["results"]]
    assert got == sorted(sent, key=lambda text: -overlap_score(query, text))[: len(got)]
    assert [r["score"] for r in answer["results"]] == [overlap_score(query, text) for text in got]


def test_a_failing_reranker_answers_in_the_fused_order_and_says_why(
    rerank_stack: Stack, server: FakeRerankServer
) -> None:
    fused = rerank_stack.search("retries", ZONE, mode="keyword", k=3, rerank=False)
    assert fused["rerank"]["applied"] is False and fused["rerank"]["reason"] == "switched off"
    server.script(TEI_RERANK, [rerank_error(503, "loading model")] * 2)
    answer = rerank_stack.search("retries", ZONE, mode="keyword", k=3)
    assert answer["rerank"]["applied"] is False and "HTTP 503" in answer["rerank"]["reason"]
    assert [r["chunk_id"] for r in answer["results"]] == [r["chunk_id"] for r in fused["results"]]
