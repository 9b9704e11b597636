"""Issue 22, item 5, on the real embedded stack through the ``shardfuse.search`` RPC: several zones searched as
one (each isolated), the document's metadata, a definition's own lines, thresholds, depths, answers without
text and candidate counts; and the ``shardfuse search`` command line with the same fields."""

from __future__ import annotations

import json
from textwrap import dedent

import pytest

from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.workers import replies
from shardfuse.workers.app import create_app
from shardfuse.workers.client import SearchClient
from shardfuse.workers.names import Task
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration

# A 34-line module whose 6-line function sits in the middle: small enough to be one chunk.
MODULE = dedent('''\
    """Caching helpers."""

    import time

    DEFAULT_TTL = 30


    class LruCache:
        """A least-recently-used cache."""

        def __init__(self, size):
            self.size = size
            self.items = {}

        def get(self, key):
            return self.items.get(key)


    def evict_stale_entries(cache, now):
        """Drop what is older than the ttl."""
        stale = [k for k, v in cache.items.items() if v < now]
        for key in stale:
            del cache.items[key]
        return len(stale)


    def render(cache):
        lines = []
        for key in cache.items:
            lines.append(str(key))
        return "\\n".join(lines)


    __all__ = ["LruCache", "evict_stale_entries", "render"]
''')
ZONES = ("req22a", "req22b", "req22c")


@pytest.fixture(scope="module")
def indexed(stack: Stack) -> Stack:
    """Three zones holding the same paths; each zone's copy says which zone it is in."""
    with stack.publisher() as publisher:
        for zone in ZONES:
            publisher.write(zone=zone, path="src/cache.py", data=MODULE.encode(),
                            metadata={"title": f"cache of {zone}", "url": f"https://example.org/{zone}/cache.py",
                                      "source": "git", "team": zone})
            for i in range(4):
                publisher.write(zone=zone, path=f"notes/{i}.md",
                                data=f"pangolinword note {i} written for {zone} only\n".encode(),
                                metadata={"source": "wiki"})
    stack.wait()
    return stack


def _client(stack: Stack) -> SearchClient:
    return SearchClient(stack.settings)


def test_two_zones_searched_as_one_and_the_third_never_seen(indexed: Stack) -> None:
    client = _client(indexed)
    for mode in ("keyword", "semantic", "hybrid"):
        answer = client.search("pangolinword note", zones=["req22a", "req22b"], k=20, mode=mode, cache=False)
        results = answer["results"]
        assert answer["zones"] == ["req22a", "req22b"] and answer["zone"] == "req22a"
        assert {r["zone"] for r in results} == {"req22a", "req22b"}, mode
        # Each result is its own zone's chunk: the text it carries says which zone it was written for.
        assert all(r["zone"] in r["text"] for r in results if "pangolinword" in r["text"]), mode
        notes = [(r["zone"], r["path"]) for r in results if r["path"].startswith("notes/")]
        assert sorted(notes) == sorted((z, f"notes/{i}.md") for z in ("req22a", "req22b") for i in range(4)), mode
    alone = client.search("pangolinword note", zone="req22c", k=20, mode="keyword")
    assert {r["zone"] for r in alone["results"]} == {"req22c"}


def test_bad_zone_lists_are_refused_by_the_worker(indexed: Stack) -> None:
    client = _client(indexed)
    with pytest.raises(InvalidQueryError, match="not both"):
        client.search("x", zone="req22a", zones=["req22b"])
    with pytest.raises(InvalidQueryError, match="more than once"):
        client.search("x", zones=["req22a", "req22a"])


def test_a_query_naming_a_function_gets_its_own_lines_and_the_document_s_metadata(indexed: Stack) -> None:
    answer = _client(indexed).search("evict_stale_entries", zone="req22b", k=3, cache=False)
    top = answer["results"][0]
    assert top["path"] == "src/cache.py" and top["zone"] == "req22b"
    assert (top["chunk_start_line"], top["chunk_end_line"]) == (1, 34)  # the whole module is one chunk
    assert top["symbol"] == {"name": "evict_stale_entries", "start_line": 19, "end_line": 24}
    assert (top["start_line"], top["end_line"]) == (19, 24)
    assert top["metadata"] == {"title": "cache of req22b", "url": "https://example.org/req22b/cache.py",
                               "source": "git", "team": "req22b"}
    assert (top["title"], top["url"], top["source"]) == ("cache of req22b", "https://example.org/req22b/cache.py",
                                                         "git")
    method = _client(indexed).search("LruCache.get", zone="req22b", k=1)["results"][0]
    assert method["symbol"] == {"name": "get", "start_line": 15, "end_line": 16}


def test_thresholds_depths_text_and_candidate_counts(indexed: Stack) -> None:
    client = _client(indexed)
    full = client.search("pangolinword note", zone="req22a", k=10, mode="keyword", cache=False)
    assert full["candidates"]["legs"] == {"keyword": 4} and full["candidates"]["fused"] == 4
    assert full["candidates"]["hydrated"] == 4

    shallow = client.search("pangolinword note", zone="req22a", k=10, keyword_depth=2, vector_depth=3,
                            include_text=False, cache=False)
    assert shallow["candidates"]["legs"]["keyword"] == 2 and shallow["candidates"]["legs"]["vector"] == 3
    assert shallow["results"] and all("text" not in r for r in shallow["results"])

    scores = [r["score"] for r in full["results"]]
    kept = client.search("pangolinword note", zone="req22a", k=10, mode="keyword", min_score=scores[1])
    assert [r["score"] for r in kept["results"]] == [s for s in scores if s >= scores[1]]
    assert client.search("pangolinword note", zone="req22a", mode="keyword", min_score=scores[0] + 1)["results"] == []

    semantic = client.search("pangolinword note", zone="req22a", k=10, mode="semantic", cache=False)
    similarities = sorted(r["vector_score"] for r in semantic["results"])
    floor = similarities[len(similarities) // 2]
    above = client.search("pangolinword note", zone="req22a", k=10, mode="semantic", min_similarity=floor)
    assert above["results"] and all(r["vector_score"] >= floor for r in above["results"])
    assert above["candidates"]["legs"]["vector"] == sum(1 for s in similarities if s >= floor)


def test_the_command_line_takes_the_new_fields(indexed: Stack) -> None:
    proc = indexed.cli("search", "pangolinword note", "--zone", "req22a", "--zone", "req22c", "--mode", "keyword",
                       "--keyword-depth", "3", "--no-include-text", "--min-score", "0", "--json")
    answer = json.loads(proc.stdout)
    assert answer["zones"] == ["req22a", "req22c"] and answer["candidates"]["legs"] == {"keyword": 3}
    assert {r["zone"] for r in answer["results"]} <= {"req22a", "req22c"}
    assert all("text" not in r for r in answer["results"])
    printed = indexed.cli("search", "evict_stale_entries", "--zone", "req22a", "-k", "1").stdout
    assert "src/cache.py:19-24" in printed
    refused = indexed.cli("search", "x", "--zone", "req22a", "--vector-depth", "0", check=False)
    assert refused.returncode == 2 and "vector_depth must be an integer from 1 to" in refused.stderr


def test_a_request_s_per_file_cap_over_a_file_of_many_chunks(indexed: Stack) -> None:
    sections = [f"## Part {i}\n\n" + " ".join(f"Paragraph {j} of part {i} describes the walrusword migration "
                                                f"routes along cold coasts." for j in range(25))
                for i in range(6)]
    with indexed.publisher() as publisher:
        publisher.write(zone="req22d", path="guide.md", data="\n\n".join(sections).encode())
    indexed.wait()
    client = _client(indexed)

    def paths(**cap: int) -> list[str]:
        answer = client.search("walrusword migration", zone="req22d", k=10, mode="keyword", cache=False, **cap)
        return [r["path"] for r in answer["results"]]

    everything = paths(max_per_file=0)
    assert len(everything) >= 4 and set(everything) == {"guide.md"}
    assert paths() == ["guide.md"] * 3  # query.max_chunks_per_file
    assert paths(max_per_file=1) == ["guide.md"]
    printed = json.loads(indexed.cli("search", "walrusword migration", "--zone", "req22d", "--mode", "keyword",
                                     "--max-per-file", "2", "--json").stdout)
    assert [r["path"] for r in printed["results"]] == ["guide.md"] * 2
    refused = indexed.cli("search", "walrusword", "--zone", "req22d", "--grep", "--max-per-file", "1", check=False)
    assert refused.returncode == 2 and "max_per_file does not apply to mode 'grep'" in refused.stderr


def test_a_client_s_answer_comes_on_its_reply_list_and_a_plain_celery_caller_s_from_the_result_backend(
        indexed: Stack) -> None:
    """workers/replies.py: a SearchClient's search stores nothing in the result backend and leaves no reply
    list behind; a caller sending ``shardfuse.search`` through Celery itself still gets its answer there."""
    app = create_app(indexed.settings)
    backend = app.backend.client
    metas = set(backend.keys("celery-task-meta-*"))
    answer = _client(indexed).search("pangolinword note", zone="req22a", k=3, mode="keyword", cache=False)
    assert [r["zone"] for r in answer["results"]] == ["req22a"] * 3
    assert set(backend.keys("celery-task-meta-*")) == metas and not backend.keys(f"{replies.PREFIX}*")

    sent = app.send_task(Task.SEARCH.value, kwargs={"query": "pangolinword note", "zone": "req22b", "k": 3,
                                                     "mode": "keyword", "cache": False})
    try:
        plain = sent.get(timeout=30)
        assert [r["zone"] for r in plain["results"]] == ["req22b"] * 3
        assert backend.exists(f"celery-task-meta-{sent.id}") and not backend.keys(f"{replies.PREFIX}*")
    finally:
        sent.forget()
