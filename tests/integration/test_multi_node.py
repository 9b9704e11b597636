"""Many nodes, no shared filesystem (issue 21): the pools on "machines" of their own give the answers one
machine gives, and survive losing a node.

One machine stands in for many: every pool is its own process group with its own empty data directory, the
CAS is SeaweedFS (``s3://``), the two shards live on two PostgreSQL servers, and the publisher, ``shardfuse
wait`` and the search client know addresses only (``tests/support/multi_node.py``). The same corpus goes
through the single-node embedded stack first; every mode's answers must then be the same on the cluster —
on its first query node, on a second one started empty, after the maintenance node is killed and replaced,
and when a query node dies holding the query (the client's retry is answered by the other node).
"""

from __future__ import annotations

import math
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shardfuse.pipeline.core.sharding import shard_for
from shardfuse.pipeline.index.lexical.layout import shard_dir
from shardfuse.pipeline.index.lexical.manifest import ShardManifest
from shardfuse.pipeline.index.store import ShardPools
from shardfuse.pipeline.index.store.lexical_publication import PostgresLexicalPublication
from shardfuse.pipeline.index.store.schema import shard_schema
from shardfuse.workers.app import create_app
from shardfuse.workers.client import SearchClient
from shardfuse.workers.names import Queue
from tests.integration.conftest import running_stack
from tests.support.multi_node import Cluster, cluster, scratch_dir, shared_servers
from tests.support.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

ZONE = "fleet"
QUERIES = ("least recently used cache eviction", "ring buffer", "rate limiter tokens", "chunking markdown headings",
           "numbat termite colony")
MODES = ("hybrid", "keyword", "semantic")
# What makes the answers comparable: the same shards, embedder, BM25 and ranking settings everywhere, no
# cached answers (a second query node must compute its own), and an HNSW search as wide as pgvector allows:
# the graphs differ with the order the chunks arrived in, and a narrow search of an approximate index may
# then miss a deep vector candidate on one side only (seen: vector rank 28 on one, none on the other).
COMMON: dict[str, Any] = {
    "shards": 2,
    "embedder": {"provider": "hashing"},
    "bm25": {"rebuild_debounce_s": 0.2},
    "query": {"result_cache_ttl_s": 0, "hnsw_ef_search": 1000},
    # Dead workers noticed within seconds.
    "delivery": {"heartbeat_s": 1, "dead_after_s": 6, "busy_retry_s": 1},
    "workers": {"ingest_concurrency": 1, "embed_concurrency": 2, "query_concurrency": 2},
}
SINGLE_NODE = {"SHARDFUSE_SHARDS": "2", "SHARDFUSE_EMBEDDER__PROVIDER": "hashing",
               "SHARDFUSE_BM25__REBUILD_DEBOUNCE_S": "0.2", "SHARDFUSE_QUERY__RESULT_CACHE_TTL_S": "0",
               "SHARDFUSE_QUERY__HNSW_EF_SEARCH": "1000"}
EXACT = ("rank", "path", "start_line", "end_line", "shard")
SCORES = ("score", "fused_score")
LEGS = ("keyword", "vector")


def write_corpus(root: Path) -> Path:
    """The fixtures' code and Markdown, and generated notes: a few dozen files, text and code."""
    for folder in ("code", "markdown", "search"):
        shutil.copytree(REPO / "tests" / "fixtures" / folder, root / folder)
    animals = ("numbat", "quokka", "bilby", "wombat", "echidna", "dingo")
    for i in range(24):
        animal = animals[i % len(animals)]
        note = root / "notes" / f"note{i:02d}.md"
        note.parent.mkdir(exist_ok=True)
        # Each section of each note a different length: no two score exactly alike in either leg (equal scores
        # are ranked by chunk id, which holds the publisher's seq and so differs between two deployments).
        note.write_text(
            f"# Field note {i}: the {animal}\n\nThe {animal} was seen near site {i} eating "
            f"{'termites from a colony' if i % 3 == 0 else 'grass and roots'}.{' Seen again.' * (i + 1)}\n\n"
            f"## Weather\n\nDay {i} was {'dry' if i % 2 else 'wet'}, {10 + i} degrees.{' Windy.' * (24 - i)}\n",
            encoding="utf-8")
    return root


def searches(search: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return {(query, mode): search(query, ZONE, mode=mode, k=8) for query in QUERIES for mode in MODES}


def leg(hit: dict[str, Any], name: str) -> tuple[int | None, float]:
    """A hit's rank and score in one leg; none for a score of 0. A candidate that matches nothing scores 0 and
    adds nothing to the fused score; whether it is in the leg at all, among the many other zeros at the leg's
    depth, is decided by chunk ids, which hold the publisher's seq and so differ between two deployments."""
    score = hit[f"{name}_score"] or 0.0
    return (hit[f"{name}_rank"] if score else None), score


def ranked(answer: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(*(hit[name] for name in EXACT), *(leg(hit, name)[0] for name in LEGS)) for hit in answer["results"]]


def assert_same_answers(got: dict[tuple[str, str], dict[str, Any]], want: dict[tuple[str, str], dict[str, Any]],
                        where: str) -> None:
    """The same results in the same order, from the same places in each leg, with the same scores (to 1e-6)."""
    for key, answer in want.items():
        assert answer["results"], f"the single-node stack found nothing for {key}: a useless comparison"
        assert ranked(got[key]) == ranked(answer), f"{where}: {key} ranks differ"
        for mine, theirs in zip(got[key]["results"], answer["results"], strict=True):
            pairs = [(name, mine[name], theirs[name]) for name in SCORES]
            pairs += [(f"{name}_score", leg(mine, name)[1], leg(theirs, name)[1]) for name in LEGS]
            for name, a, b in pairs:
                assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9), \
                    f"{where}: {key} {mine['path']} {name} {a} != {b}"


def merge(cli: Any, settings: Any) -> None:
    """Every shard's BM25 index as one generation (``shardfuse rebuild-bm25``). Keyword scores depend on how
    a shard's chunks are split between its generation and its delta (each segment normalises lengths by its
    own average), and that split follows the timing of the builds; merged, two deployments compare exactly."""
    cli("rebuild-bm25")
    cli("wait", "--timeout", "120")
    published = manifests(settings)
    assert all(m is not None and not m.delta for m in published.values()), published


def manifests(node_settings: Any) -> dict[int, ShardManifest | None]:
    """Each shard's published BM25 manifest, read from its PostgreSQL server."""
    with ShardPools(node_settings, min_size=1, max_size=1) as pools:
        return {store.shard: PostgresLexicalPublication(store.pool, store.shard, schema=shard_schema(store.shard))
                .manifest() for store in pools.stores()}


@pytest.fixture(scope="module")
def corpus() -> Iterator[Path]:
    root = scratch_dir("corpus")
    try:
        yield write_corpus(root / "repo")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def single_node_answers(corpus: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The answers of the embedded single-node stack on the corpus."""
    with running_stack(SINGLE_NODE) as stack:
        stack.cli("publish", str(corpus), "--zone", ZONE)
        stack.cli("wait", "--timeout", "120")
        merge(stack.cli, stack.settings)
        return searches(stack.search)


def test_many_nodes_answer_as_one_and_survive_losing_nodes(
    corpus: Path, single_node_answers: dict[tuple[str, str], dict[str, Any]]
) -> None:
    started = time.monotonic()
    figures: dict[str, float] = {}
    with shared_servers() as servers, cluster(servers, common=COMMON) as nodes:
        for name, queue in (("ingest-a", Queue.INGEST), ("embed-a", Queue.EMBED),
                            ("maintenance-a", Queue.MAINTENANCE), ("query-a", Queue.QUERY)):
            nodes.start(name, queue)
        nodes.wait_answering("ingest-a", "embed-a", "maintenance-a", "query-a")
        # The publisher and `shardfuse wait` know the addresses only.
        nodes.cli("publish", str(corpus), "--zone", ZONE)
        nodes.cli("wait", "--timeout", "120")
        merge(nodes.cli, nodes.client_settings())
        nodes.wait_ready("query-a")
        client = SearchClient(nodes.client_settings())
        assert_same_answers(searches(client.search), single_node_answers, "query-a")

        # A second query node on an empty directory fetches the published indexes and answers alone.
        nodes.start("query-b", Queue.QUERY)
        figures["fresh_query_node_ready_s"] = nodes.wait_ready("query-b")
        nodes.nodes["query-a"].stop()
        assert_same_answers(searches(client.search), single_node_answers, "query-b, started empty")

        check_maintenance_replaced(nodes, client)
        check_query_node_killed_mid_query(nodes, client)
    figures["wall_s"] = time.monotonic() - started
    print(f"multi-node figures: {figures}")


def check_maintenance_replaced(nodes: Cluster, client: SearchClient) -> None:
    """The maintenance node is killed; one started on another empty directory goes on building deltas over
    the published generation."""
    before = manifests(nodes.client_settings())
    assert all(m is not None for m in before.values()), before
    nodes.nodes["maintenance-a"].kill()
    replacement = nodes.start("maintenance-b", Queue.MAINTENANCE)
    nodes.wait_answering("maintenance-b")
    extra = scratch_dir("more")
    try:
        late = late_files(extra, per_shard=3)
        nodes.cli("publish", str(extra), "--zone", ZONE)
        nodes.cli("wait", "--timeout", "120")
    finally:
        shutil.rmtree(extra, ignore_errors=True)
    for word, path in late.items():
        hits = client.search(word, ZONE, mode="keyword", k=3)["results"]
        assert hits and hits[0]["path"] == path, hits
    after = manifests(nodes.client_settings())
    for shard, old in before.items():
        new = after[shard]
        assert old is not None and new is not None
        assert new.identity != old.identity, f"shard {shard}: nothing published after the kill"
        assert (new.generation, new.created_at) == (old.generation, old.created_at), \
            f"shard {shard}: a full rebuild (generation {old.generation} -> {new.generation}) instead of a delta"
        assert new.delta, f"shard {shard}: no delta published"
        # Built by the new node: the delta is in its own directory.
        assert (shard_dir(replacement.settings.bm25_root, shard) / new.delta).is_dir()


def late_files(folder: Path, *, per_shard: int) -> dict[str, str]:
    """Small files, ``per_shard`` of them on each shard (a document's shard follows its path); their one rare
    word -> their document path."""
    late: dict[str, str] = {}
    counts = [0, 0]
    for i in range(1000):
        path = folder / f"late{i}.txt"
        shard = shard_for(ZONE, str(path), 2)
        if counts[shard] < per_shard:
            counts[shard] += 1
            path.write_text(f"late arrival {i}: the platypus{i} swims at dusk\n", encoding="utf-8")
            late[f"platypus{i}"] = str(path)
        if min(counts) == per_shard:
            return late
    raise AssertionError(f"no {per_shard} paths per shard found: {counts}")


def check_query_node_killed_mid_query(nodes: Cluster, client: SearchClient) -> None:
    """A query node dies holding a search (the failpoint); the client's retry is answered by the other node."""
    query, mode = QUERIES[0], "hybrid"
    want = {(query, mode): client.search(query, ZONE, mode=mode, k=8)}  # the corpus has grown since
    data_dir = nodes.new_dir("query-c")
    marker = data_dir / "died-mid-query"
    doomed = nodes.start("query-c", Queue.QUERY, {"failpoints": {"search_started": str(marker)}}, data_dir=data_dir)
    nodes.wait_ready("query-c")
    survivor = nodes.nodes["query-b"]
    control = create_app(nodes.client_settings()).control
    # Only the doomed node takes the search: the survivor stops consuming until the doomed one is dead.
    assert control.cancel_consumer(Queue.QUERY.value, destination=[survivor.nodename], reply=True, timeout=10)
    answers: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    # Timed out before the broker would give the dead node's message back (2 × dead_after_s = 12 s): only a
    # search sent again can be answered in time.
    retrying = SearchClient(nodes.client_settings({"query": {"rpc_timeout_s": 10, "rpc_retry_after_s": 2}}))

    def search() -> None:
        try:
            answers.append(retrying.search(query, ZONE, mode=mode, k=8))
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    thread = threading.Thread(target=search)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while doomed.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not doomed.alive() and marker.exists(), "the doomed query node did not die at the failpoint"
    finally:
        assert control.add_consumer(Queue.QUERY.value, destination=[survivor.nodename], reply=True, timeout=10)
    thread.join(timeout=30)
    assert not errors, errors
    assert answers, "the search was not answered"
    assert_same_answers({(query, mode): answers[0]}, want, "the retried search")
