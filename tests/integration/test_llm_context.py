"""LLM contexts through the real pipeline: a stack whose workers ask a local chat server (the real
``openai`` client) for each chunk's context. The server dies mid-run: no document is lost, every chunk has
an LLM context or its headings context with a backfill mark, and ``backfill-context`` fills the gaps once
the server is back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from shardfuse.pipeline.index.store import ShardPools
from tests.integration.conftest import Stack, running_stack
from tests.support.chat_server import FakeChatServer

pytestmark = pytest.mark.integration
DOCUMENTS = 200
ZONE = "llm"


@pytest.fixture(scope="module")
def chat() -> Iterator[FakeChatServer]:
    with FakeChatServer(latency_s=0.01) as server:
        yield server


@pytest.fixture(scope="module")
def llm_stack(chat: FakeChatServer) -> Iterator[Stack]:
    overrides = {
        "SHARDFUSE_EMBEDDER__PROVIDER": "hashing",
        "SHARDFUSE_SHARDS": "2",
        "SHARDFUSE_BM25__REBUILD_DEBOUNCE_S": "0.2",
        "SHARDFUSE_CHUNKING__MAX_TOKENS": "48",
        "SHARDFUSE_CHUNKING__OVERLAP_TOKENS": "0",
        "SHARDFUSE_CONTEXT__SOURCE": "llm",
        "SHARDFUSE_CONTEXT__BASE_URL": chat.base_url,
        "SHARDFUSE_CONTEXT__API_KEY": "sk-test",
        "SHARDFUSE_CONTEXT__REQUEST_TIMEOUT_S": "2",
        "SHARDFUSE_CONTEXT__MAX_RETRY_S": "1",
    }
    with running_stack(overrides) as stack:
        yield stack


def _document(i: int) -> bytes:
    return (
        f"# Report {i}\n\n## Findings\n\nSample {i} showed {i % 7} anomalies in the cooling loop of unit {i}.\n\n"
        f"## Actions\n\nTechnicians replaced valve {i % 11} and logged the pressure at {100 + i} kPa.\n"
    ).encode()


def _chunk_sources(stack: Stack) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    with ShardPools(stack.settings, min_size=1, max_size=1) as pools:
        for store in pools.stores():
            with store.pool.connection() as conn:
                rows.extend(conn.execute(
                    f"SELECT path, context_source, context FROM shard_{store.shard}.chunks WHERE zone = %s",
                    (ZONE,)).fetchall())
    return rows


def _indexed(stack: Stack) -> int:
    status: dict[str, Any] = json.loads(stack.cli("status", "--json").stdout)
    return sum(z["documents"] for s in status["shard_counts"] for z in s["zones"] if z["zone"] == ZONE)


def test_a_chat_server_dying_mid_run_loses_no_document_and_backfill_fills_the_gaps(
    llm_stack: Stack, chat: FakeChatServer
) -> None:
    chat.stop_after = 150  # it answers 150 chunks, then every connection dies
    with llm_stack.publisher() as publisher:
        for i in range(DOCUMENTS):
            publisher.write(zone=ZONE, path=f"reports/r{i:03d}.md", data=_document(i))
    llm_stack.wait(timeout=300)
    assert chat.is_down
    assert _indexed(llm_stack) == DOCUMENTS
    rows = _chunk_sources(llm_stack)
    sources = [source for _, source, _ in rows]
    assert set(sources) == {"llm", "backfill"} and sources.count("llm") <= 150
    assert all(context for _, _, context in rows)  # a backfill chunk keeps its headings context meanwhile
    backfill = {path for path, source, context in rows if source == "backfill"}
    print(f"\n{DOCUMENTS} documents, {len(rows)} chunks: {sources.count('llm')} with an LLM context, "
          f"{sources.count('backfill')} (of {len(backfill)} documents) marked for backfill")
    assert all(context.startswith(path) for path, source, context in rows if source == "backfill")
    status = json.loads(llm_stack.cli("status", "--json").stdout)
    waiting = sum(z.get("backfill_documents", 0) for s in status["shard_counts"] for z in s["zones"]
                  if z["zone"] == ZONE)
    assert waiting == len(backfill)

    answered = chat.answered
    chat.come_back()
    out = llm_stack.cli("backfill-context", "--zone", ZONE).stdout
    assert f"re-published {len(backfill)} document(s)" in out
    llm_stack.wait(timeout=300)
    rows = _chunk_sources(llm_stack)
    assert {source for _, source, _ in rows} == {"llm"}
    assert all(context.startswith("Context:") for _, _, context in rows)
    # Re-indexing asked the model only for the missing contexts: the others came from the context cache.
    assert chat.answered - answered == sources.count("backfill")
    assert _indexed(llm_stack) == DOCUMENTS
