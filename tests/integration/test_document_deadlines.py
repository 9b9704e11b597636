"""Per-document deadlines on a real stack whose ingest workers ask a local chat server for LLM contexts
(issue 20, item 2): one message of 16 documents, one of which the model stalls on. That document overruns
its deadline (``ingest.document_deadline_s``) and is dead-lettered with a reason naming it; the 15 others
are indexed (PostgreSQL rows, found by keyword and by semantic search); nothing is lost and no ingest
process died. (The hard time limit: tests/integration/test_hard_time_limit.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psutil
import psycopg
import pytest

from shardfuse.pipeline.index.store.schema import SHARED_SCHEMA
from tests.integration.conftest import Stack, running_stack
from tests.support.chat_server import FakeChatServer, fake_context, prompt_of
from tests.support.openai_server import CHAT_COMPLETIONS, Received, Reply
from tests.support.polling import eventually

pytestmark = pytest.mark.integration
# Far below the stall, far above what a sibling takes on a loaded machine (3 s once dead-lettered two siblings
# while the fault tests ran beside this suite).
DEADLINE_S = 10.0
STALL = "THE-MODEL-STALLS-ON-THIS"  # in a document: every context request for it hangs for a minute


def _chat(request: Received) -> Reply:
    prompt = prompt_of(request)
    return Reply.chat(fake_context(prompt), delay_s=60.0 if STALL in prompt else 0.0)


@pytest.fixture(scope="module")
def chat() -> Iterator[FakeChatServer]:
    with FakeChatServer() as server:
        server.route(CHAT_COMPLETIONS, _chat)
        yield server


@pytest.fixture(scope="module")
def deadline_stack(chat: FakeChatServer) -> Iterator[Stack]:
    overrides = {
        "SHARDFUSE_EMBEDDER__PROVIDER": "hashing",
        "SHARDFUSE_SHARDS": "2",
        "SHARDFUSE_BM25__REBUILD_DEBOUNCE_S": "0.2",
        "SHARDFUSE_BROKER__EVENTS_PER_MESSAGE": "16",
        "SHARDFUSE_CONTEXT__SOURCE": "llm",
        "SHARDFUSE_CONTEXT__BASE_URL": chat.base_url,
        "SHARDFUSE_CONTEXT__API_KEY": "sk-test",
        "SHARDFUSE_CONTEXT__REQUEST_TIMEOUT_S": "30",  # longer than the deadline: the deadline cuts it short
        "SHARDFUSE_CONTEXT__MAX_RETRY_S": "1",
        "SHARDFUSE_INGEST__DOCUMENT_DEADLINE_S": str(DEADLINE_S),
    }
    with running_stack(overrides) as stack:
        yield stack


def _word(i: int) -> str:
    return "quix" + "".join(chr(97 + d) for d in divmod(i, 26)) + "zor"


def _document(i: int, marker: str = "") -> bytes:
    return (f"# Maintenance report {i}\n\nThe pump in hall {_word(i)} was inspected. {marker}\n\n"
            f"## Actions\n\nTechnicians replaced the seals and logged the pressure.\n").encode()


def dead_letters(stack: Stack, zone: str) -> list[dict[str, Any]]:
    with psycopg.connect(stack.settings.postgres.dsn) as conn:
        rows = conn.execute(f"SELECT path, error_class, reason FROM {SHARED_SCHEMA}.deadletters WHERE zone = %s "
                            "ORDER BY id", (zone,)).fetchall()
    return [{"path": p, "error_class": e, "reason": r} for p, e, r in rows]


def indexed(stack: Stack, zone: str) -> dict[str, int]:
    """Path -> chunk rows, of every document of ``zone`` with chunks in PostgreSQL."""
    found: dict[str, int] = {}
    with psycopg.connect(stack.settings.postgres.dsn) as conn:
        for shard in range(stack.settings.shards):
            found.update(conn.execute(f"SELECT path, count(*) FROM shard_{shard}.chunks WHERE zone = %s "
                                      "GROUP BY path", (zone,)).fetchall())
    return found


def ingest_processes(stack: Stack) -> set[int]:
    pool = psutil.Process(stack.state.components["worker-ingest"].pid)
    return {pool.pid, *(child.pid for child in pool.children(recursive=True))}


def _top_path(stack: Stack, query: str, zone: str, mode: str) -> str | None:
    results = stack.search(query, zone, mode=mode, k=3)["results"]
    return results[0]["path"] if results else None


def test_a_document_that_overruns_its_deadline_is_dead_lettered_and_its_15_siblings_are_indexed(
    deadline_stack: Stack,
) -> None:
    zone = "deadlines"
    processes = ingest_processes(deadline_stack)
    paths = [f"reports/r{i:02d}.md" for i in range(16)]
    with deadline_stack.publisher() as publisher:  # the 16 events travel as one message
        for i, path in enumerate(paths):
            publisher.write(zone=zone, path=path, data=_document(i, STALL if i == 7 else ""))
    deadline_stack.wait(timeout=180)
    dead = eventually(lambda: dead_letters(deadline_stack, zone), timeout=30, what="the overrun document's dead letter")

    assert [letter["path"] for letter in dead] == [paths[7]]
    assert dead[0]["error_class"].endswith("DeadlineExceededError")
    assert f"ran past its {DEADLINE_S:g}s deadline (ingest.document_deadline_s)" in dead[0]["reason"]
    found = indexed(deadline_stack, zone)
    assert sorted(found) == sorted(p for i, p in enumerate(paths) if i != 7)
    for i, path in enumerate(paths):
        if i == 7:
            continue
        assert _top_path(deadline_stack, _word(i), zone, "keyword") == path, f"keyword leg misses {path}"
        assert _top_path(deadline_stack, f"pump in hall {_word(i)}", zone, "semantic") == path, \
            f"semantic leg misses {path}"
    assert ingest_processes(deadline_stack) == processes  # no process died or was killed
    print(f"\n16 documents in one message: {len(found)} indexed (keyword and semantic), {len(dead)} dead letter "
          f"({dead[0]['reason'][:80]}...)")
