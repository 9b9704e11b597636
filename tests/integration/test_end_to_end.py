"""The whole path on the real embedded stack: publish → ingest → embed → shards → search RPC."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

import psycopg
import pytest

from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration


REPO = Path(__file__).resolve().parents[2]


def _paths(answer: dict) -> list[str]:
    return [hit["path"] for hit in answer["results"]]


def test_300_published_documents_are_all_searchable(stack: Stack) -> None:
    zone = "bulk"
    with stack.publisher() as publisher:
        for i in range(300):
            text = f"Document number {i}.\nIts marker word is zq{i:04d}marker and nothing else.\n"
            publisher.write(zone=zone, path=f"docs/doc_{i:04d}.txt", data=text.encode())
    stack.wait()
    for i in range(300):
        answer = stack.search(f"zq{i:04d}marker", zone, k=3, mode="keyword")
        assert _paths(answer)[:1] == [f"docs/doc_{i:04d}.txt"], answer
    # The vector leg answers too, from pgvector, for the same documents.
    answer = stack.search("zq0150marker", zone, k=5, mode="semantic")
    assert "docs/doc_0150.txt" in _paths(answer)

    with psycopg.connect(stack.settings.postgres.dsn) as conn:
        docs = sum(conn.execute(
            f"SELECT count(*) FROM shard_{s}.documents WHERE zone = %s AND status = 'indexed'", (zone,)
        ).fetchone()[0] for s in range(stack.settings.shards))
        per_shard = [conn.execute(f"SELECT count(*) FROM shard_{s}.documents WHERE zone = %s", (zone,))
                     .fetchone()[0] for s in range(stack.settings.shards)]
    assert docs == 300
    assert all(n > 0 for n in per_shard), per_shard  # hash placement uses every shard


def test_results_carry_lines_scores_and_leg_ranks(stack: Stack) -> None:
    zone = "shape"
    body = "\n".join(f"line {n} filler text" for n in range(1, 40)) + "\nthe needle is hidden here xylophone\n"
    with stack.publisher() as publisher:
        publisher.write(zone=zone, path="notes/needle.md", data=body.encode())
    stack.wait()
    answer = stack.search("xylophone needle", zone, k=5)
    top = answer["results"][0]
    assert top["path"] == "notes/needle.md" and top["zone"] == zone
    assert top["start_line"] <= 40 <= top["end_line"]
    assert "xylophone" in top["text"]
    assert top["keyword_rank"] == 1 and top["vector_rank"] is not None and top["score"] > 0
    assert set(answer["timings_ms"]) >= {"keyword", "vector", "fuse", "hydrate", "total"}


def test_updated_document_returns_only_its_new_text(stack: Stack) -> None:
    zone = "update"
    with stack.publisher() as publisher:
        publisher.write(zone=zone, path="a.txt", data=b"the original wording mentions walrusoldterm")
        publisher.write(zone=zone, path="other.txt", data=b"an unrelated neighbour document")
    stack.wait()
    assert _paths(stack.search("walrusoldterm", zone, mode="keyword")) == ["a.txt"]

    with stack.publisher() as publisher:
        publisher.write(zone=zone, path="a.txt", data=b"the rewritten wording mentions narwhalnewterm")
    stack.wait()
    for mode in ("keyword", "semantic", "hybrid"):
        for hit in stack.search("walrusoldterm", zone, mode=mode)["results"]:
            assert "walrusoldterm" not in hit["text"], (mode, hit)
    new = stack.search("narwhalnewterm", zone, mode="keyword")["results"]
    assert [h["path"] for h in new] == ["a.txt"] and "narwhalnewterm" in new[0]["text"]


def test_deleted_document_is_gone_and_a_late_older_write_cannot_resurrect_it(stack: Stack) -> None:
    zone = "delete"
    with stack.publisher() as publisher:
        publisher.write(zone=zone, path="gone.txt", data=b"ephemeral platypusterm content", seq=10)
        publisher.write(zone=zone, path="kept.txt", data=b"durable platypusterm content", seq=10)
    stack.wait()
    assert sorted(_paths(stack.search("platypusterm", zone, mode="keyword"))) == ["gone.txt", "kept.txt"]

    with stack.publisher() as publisher:
        publisher.delete(zone=zone, path="gone.txt", seq=20)
    stack.wait()
    with stack.publisher() as publisher:  # delivered after the delete, but older than it
        publisher.write(zone=zone, path="gone.txt", data=b"stale platypusterm resurrection", seq=15)
    stack.wait()
    for mode in ("keyword", "semantic", "hybrid"):
        assert _paths(stack.search("platypusterm", zone, mode=mode)) == ["kept.txt"], mode


def test_binary_file_is_recorded_as_skipped_while_the_rest_index(stack: Stack) -> None:
    zone = "binary"
    with stack.publisher() as publisher:
        publisher.write(zone=zone, path="image.png", data=b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
        publisher.write(zone=zone, path="bad.txt", data=b"caf\xe9 latin-1 bytes \xff\xfe wombatterm")
        publisher.write(zone=zone, path="good.txt", data=b"plain text about wombatterm")
    stack.wait()
    assert _paths(stack.search("wombatterm", zone, mode="keyword")) == ["good.txt"]
    status = json.loads(stack.cli("status", "--json").stdout)
    skipped = {row["path"]: row["reason"] for row in status["skipped"] if row["zone"] == zone}
    assert set(skipped) == {"image.png", "bad.txt"}
    assert "binary" in skipped["image.png"] and "UTF-8" in skipped["bad.txt"]


def test_zone_a_never_sees_zone_b(stack: Stack) -> None:
    with stack.publisher() as publisher:
        for i in range(30):
            publisher.write(zone="b", path=f"b/{i}.txt", data=f"shared ocelotterm words, b copy {i}".encode())
        publisher.write(zone="a", path="a/only.txt", data=b"shared ocelotterm words, a copy")
        publisher.write(zone="b", path="b/secret.txt", data=b"capybarasecret appears only in zone b")
    stack.wait()
    for mode in ("keyword", "semantic", "hybrid"):
        answer = stack.search("shared ocelotterm words", "a", k=20, mode=mode)
        assert {h["zone"] for h in answer["results"]} == {"a"}, mode
        assert _paths(answer) == ["a/only.txt"], mode
        assert all(h["zone"] == "a" for h in stack.search("capybarasecret", "a", mode=mode)["results"])
    assert _paths(stack.search("capybarasecret", "b", mode="keyword")) == ["b/secret.txt"]


def test_cli_publish_wait_search_as_a_new_user(stack: Stack, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "build").mkdir()
    (project / ".gitignore").write_text("build/\n*.log\n")
    (project / "src" / "tokenizer.py").write_text(
        "def split_camel_case(identifier):\n    '''Split camelCase identifiers into words.'''\n    return []\n"
    )
    (project / "src" / "storage.py").write_text("class BlobStorage:\n    '''Stores blobs on disk.'''\n")
    (project / "build" / "tokenizer.py").write_text("def split_camel_case(): pass  # build output\n")
    (project / "debug.log").write_text("split_camel_case was called\n")

    published = stack.cli("publish", str(project), "--zone", "cli")
    assert "published 3 file(s)" in published.stdout  # .gitignore, src/tokenizer.py, src/storage.py
    stack.cli("wait", "--timeout", "120")
    out = stack.cli("search", "split camelCase identifiers", "--zone", "cli", "--json").stdout
    paths = _paths(json.loads(out))
    assert paths[0].endswith("project/src/tokenizer.py")
    assert not any("build/" in p or p.endswith(".log") for p in paths)
    text = stack.cli("search", "split camelCase identifiers", "--zone", "cli", "-k", "2").stdout
    assert "src/tokenizer.py:1-3" in text


def test_cli_publish_reports_a_file_no_event_can_carry_and_publishes_the_rest(stack: Stack, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("first.md", "last.md"):
        (tree / name).write_text(f"# {name}\nquetzalword in {name}\n")
    (tree / os.fsdecode(b"latin1-\xe9.md")).write_bytes(b"a name that is not UTF-8\n")

    published = stack.cli("publish", str(tree), "--zone", "cli-names", check=False)
    assert published.returncode == 1, published
    assert "published 2 file(s)" in published.stdout
    assert "not published: " in published.stderr and "rename the file to valid UTF-8" in published.stderr
    stack.cli("wait", "--timeout", "120")
    found = sorted(_paths(stack.search("quetzalword", "cli-names", mode="keyword")))
    assert [path.removeprefix(str(tmp_path)) for path in found] == ["/tree/first.md", "/tree/last.md"]


def test_send_task_from_an_unrelated_process_matches_the_cli(stack: Stack) -> None:
    with stack.publisher() as publisher:
        for i in range(5):
            publisher.write(zone="rpc", path=f"rpc/{i}.md", data=f"remote procedure call number {i}".encode())
    stack.wait()
    # The broker URL with the stack's password (status prints it masked: redis://:***@…).
    broker = stack.settings.broker.url
    assert json.loads(stack.cli("status", "--json").stdout)["broker_url"].startswith("redis://:***@")
    backend = stack.settings.broker.result_backend
    script = (
        "import json, sys\n"
        "from celery import Celery\n"
        f"app = Celery(broker={broker!r}, backend={backend!r})\n"
        "app.conf.update(task_serializer='json', accept_content=['json'], result_accept_content=['json'])\n"
        "r = app.send_task('shardfuse.search', kwargs={'query': 'remote procedure call', 'zone': 'rpc', 'k': 5},"
        " queue='query')\n"
        "print(json.dumps(r.get(timeout=30)))\n"
    )
    # A bare interpreter with only Celery: none of shardfuse's settings or environment.
    foreign = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin"}, cwd="/")
    assert foreign.returncode == 0, foreign.stderr
    via_task = json.loads(foreign.stdout)
    via_cli = json.loads(stack.cli("search", "remote procedure call", "--zone", "rpc", "-k", "5", "--json").stdout)
    assert [h["chunk_id"] for h in via_task["results"]] == [h["chunk_id"] for h in via_cli["results"]]
    assert len(via_task["results"]) == 5


def test_bad_search_requests_get_clear_errors(stack: Stack) -> None:
    for args, message in [
        (("search", "   ", "--zone", "z"), "non-empty"),
        (("search", "x", "--zone", "bad zone!"), "zone"),
        (("search", "x", "--zone", "z", "-k", "0"), "k must be"),
    ]:
        proc = stack.cli(*args, check=False)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    unknown_zone = json.loads(stack.cli("search", "anything", "--zone", "never-used", "--json").stdout)
    assert unknown_zone["results"] == []


def test_flower_requires_auth_and_lists_a_worker_per_queue(stack: Stack) -> None:
    url = stack.state.flower_url.rstrip("/")
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{url}/api/workers", timeout=10)
    assert denied.value.code == 401
    flower = stack.settings.flower
    token = b64encode(f"{flower.user}:{flower.password.get_secret_value()}".encode()).decode()
    request = urllib.request.Request(f"{url}/api/workers?refresh=1", headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        workers = json.loads(response.read())
    names = {name.split("@")[0] for name in workers}
    assert names >= {"ingest", "embed", "maintenance", "query"}, workers.keys()


def test_bad_events_are_dead_lettered_with_a_reason_and_never_block_the_queue(stack: Stack) -> None:
    from shardfuse.workers.app import create_app
    from shardfuse.workers.names import Task

    app = create_app(stack.settings)
    malformed = {"op": "write", "zone": "dlq", "path": "x.txt", "content_hash": "sha256:nothex", "seq": 1}
    missing = {"op": "write", "zone": "dlq", "path": "missing.txt", "content_hash": "sha256:" + "e" * 64,
               "size": 1, "seq": 1}
    app.send_task(Task.INGEST.value, kwargs={"event": malformed})
    app.send_task(Task.INGEST.value, kwargs={"event": missing})
    app.send_task(Task.INGEST.value, kwargs={"event": "{not json"})
    with stack.publisher() as publisher:  # queued behind the bad ones
        publisher.write(zone="dlq", path="fine.txt", data=b"a healthy quokkaterm document")
    stack.wait()
    assert _paths(stack.search("quokkaterm", "dlq", mode="keyword")) == ["fine.txt"]
    status = json.loads(stack.cli("status", "--json").stdout)
    reasons = {row["path"]: row for row in status["failed"] if row["zone"] == "dlq"}
    assert "content_hash" in reasons["x.txt"]["reason"]
    assert "missing.txt" in reasons and reasons["missing.txt"]["error_class"].endswith("ContentNotFoundError")
    assert reasons["missing.txt"]["attempts"] == 1  # permanent: not retried
    assert status["dead_letters"] >= 3
    assert any("invalid write event" in row["reason"] and row["path"] is None for row in status["failed"])


def test_a_message_of_many_events_settles_each_event_on_its_own(stack: Stack) -> None:
    """One bad event in a message is dead-lettered alone; its neighbours are indexed, and their documents
    reach the embed stage together in one message."""
    from shardfuse.pipeline.storage.cas import LocalContentStore
    from shardfuse.workers.app import create_app
    from shardfuse.workers.names import Task

    cas = LocalContentStore(stack.settings.cas_root)
    good = [
        {"op": "write", "zone": "many", "path": f"ok{i}.txt", "seq": 1, "size": len(text),
         "content_hash": cas.put(text)}
        for i, text in enumerate([b"the first wallabyzest document", b"the second wallabyzest document"])
    ]
    missing = {"op": "write", "zone": "many", "path": "gone.txt", "content_hash": "sha256:" + "f" * 64,
               "size": 1, "seq": 1}
    create_app(stack.settings).send_task(Task.INGEST.value, kwargs={"events": [good[0], missing, "{nope", good[1]]})
    stack.wait()
    assert sorted(_paths(stack.search("wallabyzest", "many", mode="keyword"))) == ["ok0.txt", "ok1.txt"]
    status = json.loads(stack.cli("status", "--json").stdout)
    failed = [row for row in status["failed"] if row["zone"] == "many"]
    assert [row["path"] for row in failed] == ["gone.txt"] and failed[0]["attempts"] == 1


def test_a_bulk_load_defers_the_hnsw_index_and_the_maintenance_pool_builds_it_after(stack: Stack) -> None:
    from shardfuse.pipeline.index.store import ShardPools
    from shardfuse.workers.app import create_app
    from shardfuse.workers.names import Queue
    from shardfuse.workers.stack.celery_processes import worker_nodename
    from shardfuse.workers.stack.layout import StackLayout

    log = StackLayout(stack.settings.data_path).log_file("worker-embed")
    dropped_before = log.read_text().count("HNSW index dropped for a bulk load")
    # The load arrives while the ingest pool is paused, as a backlog (a trickle the workers keep up with
    # never defers the index: the load coming at a shard is what waits in the queues).
    control = create_app(stack.settings).control
    # Addressed to the ingest pool alone: a broadcast add_consumer would make every pool consume `ingest` for
    # the rest of the session (ingest tasks then ran on the embed, maintenance and query pools).
    ingest_pool = [worker_nodename(Queue.INGEST)]
    assert control.cancel_consumer(Queue.INGEST.value, destination=ingest_pool, reply=True, timeout=10)
    try:
        with stack.publisher() as publisher:
            for i in range(600):
                publisher.write(zone="bulk", path=f"b{i:04d}.txt",
                                data=f"bulk document {i} about the numbat {i % 13}\n\nsecond part {i}".encode())
    finally:
        assert control.add_consumer(Queue.INGEST.value, destination=ingest_pool, reply=True, timeout=10)
    stack.wait()  # idle means the deferred builds ran too
    assert log.read_text().count("HNSW index dropped for a bulk load") > dropped_before
    with ShardPools(stack.settings, min_size=1, max_size=1) as pools:
        for store in pools.stores():
            assert not store.vector_index_deferred()
            with store.pool.connection() as conn:
                valid = conn.execute(
                    "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
                    (f"shard_{store.shard}", "chunks_embedding_hnsw"),
                ).fetchone()
            assert valid == (True,)
    hits = stack.search("bulk document 417 about the numbat 1", "bulk", mode="semantic", k=5)["results"]
    assert hits and hits[0]["path"] == "b0417.txt"


# Source files as they stood before the restructure (tests/fixtures/search): what is searched must not change
# whenever our own code does, or a refactoring of these very modules would move the ranking under the test.
SEARCHED_SOURCES = {"pipeline/chunking.py": "chunking.py.txt", "pipeline/preparation.py": "preparation.py.txt",
                    "pipeline/ingest.py": "ingest.py.txt"}


def test_a_query_naming_a_function_finds_the_chunk_that_defines_it(stack: Stack) -> None:
    fixtures = REPO / "tests" / "fixtures"
    with stack.publisher() as publisher:
        for name, fixture in SEARCHED_SOURCES.items():
            publisher.write(zone="code", path=name, data=(fixtures / "search" / fixture).read_bytes())
        publisher.write(zone="code", path="docs/architecture.md",
                        data=(fixtures / "markdown" / "architecture.md").read_bytes())
    stack.wait()
    text = (fixtures / "search" / "preparation.py.txt").read_text(encoding="utf-8")
    def_line = text[: text.index("def prepare_chunks(")].count("\n") + 1
    for mode in ("hybrid", "keyword"):
        top = stack.search("prepare_chunks", "code", mode=mode, k=3)["results"][0]
        assert (top["path"], top["primary_symbol"], top["language"]) == (
            "pipeline/preparation.py", "prepare_chunks", "python")
        assert top["start_line"] <= def_line <= top["end_line"] and "prepare_chunks" in top["symbols"]
    doc = stack.search("how are a document's old chunks replaced atomically", "code", k=3)["results"]
    assert any(hit["heading_path"][-1:] == ["How a document's chunks are replaced atomically"] for hit in doc)


def test_dead_letters_can_be_listed_shown_retried_once_fixed_and_purged(stack: Stack) -> None:
    import hashlib

    from shardfuse.pipeline.storage.cas import LocalContentStore
    from shardfuse.workers.app import create_app
    from shardfuse.workers.names import Task

    data = b"a document about the quokkaroo that arrived before its content"
    content_hash = "sha256:" + hashlib.sha256(data).hexdigest()
    early = {"op": "write", "zone": "dead", "path": "early.txt", "content_hash": content_hash, "size": len(data),
             "seq": 1}
    app = create_app(stack.settings)
    app.send_task(Task.INGEST.value, kwargs={"event": early})
    app.send_task(Task.INGEST.value, kwargs={"event": {**early, "path": "never.txt",
                                                       "content_hash": "sha256:" + "c" * 64}})
    stack.wait()
    listed = json.loads(stack.cli("deadletters", "list", "--zone", "dead", "--json").stdout)
    by_path = {row["path"]: row for row in listed}
    assert set(by_path) == {"early.txt", "never.txt"}
    assert by_path["early.txt"]["error_class"].endswith("ContentNotFoundError")
    shown = json.loads(stack.cli("deadletters", "show", str(by_path["early.txt"]["id"])).stdout)
    assert shown["payload"] == {"event": early} and shown["reason"]

    LocalContentStore(stack.settings.cas_root).put(data)  # the content arrives
    out = stack.cli("deadletters", "retry", str(by_path["early.txt"]["id"])).stdout
    assert "retried 1 dead letter(s)" in out
    stack.wait()
    assert _paths(stack.search("quokkaroo", "dead", mode="keyword")) == ["early.txt"]
    left = json.loads(stack.cli("deadletters", "list", "--zone", "dead", "--json").stdout)
    assert [row["path"] for row in left] == ["never.txt"]
    assert stack.cli("deadletters", "purge", "--zone", "dead", check=False).returncode == 2  # needs --yes
    assert "purged 1 dead letter(s)" in stack.cli("deadletters", "purge", "--zone", "dead", "--yes").stdout
    assert json.loads(stack.cli("deadletters", "list", "--zone", "dead", "--json").stdout) == []


def test_a_second_up_starts_nothing_and_keeps_every_process(stack: Stack) -> None:
    before = {name: comp.pid for name, comp in stack.state.components.items()}
    again = stack.cli("up", "--timeout", "60")
    assert "nothing started" in again.stdout
    status = json.loads(stack.cli("status", "--json").stdout)
    assert {name: proc["pid"] for name, proc in status["processes"].items()} == before
    assert all(proc["alive"] for proc in status["processes"].values())


def test_eval_scores_every_mode_on_a_small_beir_folder(stack: Stack, tmp_path: Path) -> None:
    topics = ["volcanic eruptions and lava flows", "neural networks learn representations",
              "medieval castles had thick walls", "coral reefs bleach in warm water",
              "compilers translate source code", "honeybees communicate by dancing"]
    corpus = [{"_id": f"d{i}", "title": f"On topic {i}", "text": f"{topic}. Filler sentence number {i}."}
              for i, topic in enumerate(topics)]
    queries = [{"_id": f"q{i}", "text": " ".join(topic.split()[:2])} for i, topic in enumerate(topics)]
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps(d) for d in corpus) + "\n")
    (tmp_path / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries) + "\n")
    (tmp_path / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\r\n" + "".join(f"q{i}\td{i}\t1\r\n" for i in range(len(topics))))
    proc = stack.cli("eval", str(tmp_path), "--json", "--zone", "evaltiny")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(report) == {"keyword", "semantic", "hybrid"}
    # each query names its document's two leading words: keyword search finds every one first
    assert report["keyword"]["ndcg@10"] == 1.0 and report["keyword"]["mrr@10"] == 1.0
    assert report["hybrid"]["recall@100"] == 1.0
    # The second pass asks at k=10, as a user would, and is scored too.
    assert report["keyword"]["k10_ndcg@10"] == 1.0 and report["keyword"]["k10_mrr@10"] == 1.0
    for row in report.values():
        assert row["queries"] == 6 and 0 < row["latency_p50_ms"] <= row["latency_p95_ms"]
        assert 0 < row["k10_ndcg@10"] <= 1 and 0 < row["k10_latency_p50_ms"] <= row["k10_latency_p95_ms"]
    assert any(line.startswith("mode") and "k10_ndcg@10" in line for line in proc.stdout.splitlines())
    again = stack.cli("eval", str(tmp_path), "--json", "--zone", "evaltiny", "--modes", "keyword")
    assert "not republishing" in again.stderr and set(json.loads(again.stdout.strip().splitlines()[-1])) == {"keyword"}
    wrong = stack.cli("eval", str(tmp_path), "--shards", "5", check=False)
    assert wrong.returncode == 2 and "SHARDFUSE_SHARDS=5" in wrong.stderr
