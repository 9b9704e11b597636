"""Security on the session's stack: zones never leak into each other, messages are JSON only, SQL values
are parameters.

Passwords, secrets and Flower's credentials (on a stack of their own, with every secret set) are in
test_secrets.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.coordination.chunk_registry import RedisChunkRegistry
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.preparation import prepare_chunks
from shardfuse.workers.broker.inbox import UNREADABLE_KEY
from tests.integration.conftest import REPO, Stack

pytestmark = pytest.mark.integration

ZONE_A, ZONE_B = "sec-a", "sec-b"
# Zone B's documents, and zone A's: the same paths, one identical text (shared/same.txt: one embedding-cache
# row serves both zones), A's own texts full of the words B's queries ask for, and a marker B must never see.
B_DOCS = {
    "shared/guide.md": "# Guide\n\nThe heron migration schedule lists every heron colony and its winter route.\n",
    "shared/api.py": "def heron_route(colony):\n    '''Return the winter route of a heron colony.'''\n    return 1\n",
    "shared/same.txt": "Identical in both zones: the kestrel feeds at dawn near the old quarry.\n",
    "b/notes.txt": "Field notes: kestrel sightings at the quarry, heron counts at the lake.\n",
    "b/lake.md": "# Lake\n\nThe lake hosts herons, kestrels and a single osprey in summer.\n",
}
MARKER = "alphaonlymarker"
A_DOCS = {
    "shared/guide.md": f"# Guide\n\nZone A guide {MARKER}: heron migration schedule, heron route, heron colony.\n",
    "shared/api.py": f"def heron_route(colony):\n    '''{MARKER} winter route of a heron colony.'''\n    return 2\n",
    "shared/same.txt": B_DOCS["shared/same.txt"],
    "b/notes.txt": f"{MARKER} notes: kestrel quarry heron lake osprey migration route.\n",
    "a/secret.txt": f"{MARKER} secret: heron kestrel osprey quarry lake migration winter route colony.\n",
}
QUERIES = ["heron migration route", "kestrel quarry", MARKER, "osprey lake summer", "kestrel feeds at dawn"]
MODES = ("keyword", "semantic", "hybrid")
WHERE: list[dict[str, Any]] = [{}, {"path_prefix": "shared/"}, {"filters": {"team": "birds"}},
                               {"path_prefix": "b/", "filters": {"team": "birds"}}]


def _publish(stack: Stack, zone: str, docs: dict[str, str]) -> None:
    with stack.publisher() as publisher:
        for path, text in docs.items():
            publisher.write(zone=zone, path=path, data=text.encode(), metadata={"team": "birds"}, seq=1)
    stack.wait()


def _chunk_rows(stack: Stack, zone: str) -> dict[str, tuple[str, str]]:
    """chunk_id -> (path, chunk_hash) of every chunk of ``zone``."""
    rows: dict[str, tuple[str, str]] = {}
    with psycopg.connect(stack.settings.postgres.dsn) as conn:
        for shard in range(stack.settings.shards):
            rows.update({r[0]: (r[1], r[2]) for r in conn.execute(
                f"SELECT chunk_id, path, chunk_hash FROM shard_{shard}.chunks WHERE zone = %s", (zone,))})
    return rows


def _answers(stack: Stack, zone: str, **extra: Any) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    out = {}
    for query in QUERIES:
        for mode in MODES:
            for where in WHERE:
                answer = stack.search(query, zone, k=10, mode=mode, cache=False, **where, **extra)
                out[(query, mode, json.dumps(where))] = answer["results"]
    return out


def _embedding_key(conn: psycopg.Connection[Any], chunk_id: str) -> str:
    """What the embedding cache keys a stored chunk by (``Chunk.embedding_key``: its context and text)."""
    for shard in range(2):
        row = conn.execute(f"SELECT context, text FROM shard_{shard}.chunks WHERE chunk_id = %s",
                           (chunk_id,)).fetchone()
        if row is not None:
            indexed = f"{row[0]}\n\n{row[1]}" if row[0] else row[1]
            return "sha256:" + hashlib.sha256(indexed.encode()).hexdigest()
    raise AssertionError(f"no chunk {chunk_id}")


def _ids(hits: list[dict[str, Any]]) -> list[str]:
    return [hit["chunk_id"] for hit in hits]


def test_zone_b_answers_are_the_same_before_and_after_zone_a_is_indexed_over_the_same_paths(stack: Stack) -> None:
    _publish(stack, ZONE_B, B_DOCS)
    alone = _answers(stack, ZONE_B)  # zone B alone (no zone A yet)
    _publish(stack, ZONE_A, A_DOCS)
    b_chunks, a_chunks = _chunk_rows(stack, ZONE_B), _chunk_rows(stack, ZONE_A)
    assert set(b_chunks).isdisjoint(a_chunks) and len(a_chunks) >= len(A_DOCS)

    after = _answers(stack, ZONE_B)
    for key, hits in after.items():
        if key[1] == "semantic":
            assert hits, key  # the vector leg always has neighbours; keyword legs may rightly have none
        if key[:2] == (MARKER, "keyword"):
            assert hits == [], key  # no chunk of zone B holds zone A's marker
        assert {hit["zone"] for hit in hits} <= {ZONE_B}, key
        assert set(_ids(hits)) <= set(b_chunks), key
        assert not any(MARKER in hit["text"] for hit in hits), key
        # The same chunks as when zone A did not exist; the vector leg's answer is identical, order and scores.
        # Keyword scores move a little (BM25 length normalisation is per shard, across zones: documented), so
        # near-tied keyword hits may swap places; they stay zone B's own chunks.
        assert set(_ids(hits)) == set(_ids(alone[key])), key
        if key[1] == "semantic":
            assert _ids(hits) == _ids(alone[key]), key
            assert [h["score"] for h in hits] == pytest.approx([h["score"] for h in alone[key]]), key
    # Zone A, searched the same way, holds its own chunks only (and its marker).
    for mode in MODES:
        hits = stack.search(MARKER, ZONE_A, k=10, mode=mode, cache=False)["results"]
        assert {hit["zone"] for hit in hits} == {ZONE_A} and set(_ids(hits)) <= set(a_chunks)
    # shardfuse status counts each zone's own documents.
    status = json.loads(stack.cli("status", "--json").stdout)
    counts = {zone: sum(z["documents"] for s in status["shard_counts"] for z in s["zones"] if z["zone"] == zone)
              for zone in (ZONE_A, ZONE_B)}
    assert counts == {ZONE_A: len(A_DOCS), ZONE_B: len(B_DOCS)}


def test_caches_shared_across_zones_never_show_another_zones_chunk(stack: Stack) -> None:
    """The query-embedding cache (by text) and the embedding cache (by chunk content) serve both zones; the
    result cache is keyed by zone. None of them lets a zone-A chunk into a zone-B answer."""
    if not _chunk_rows(stack, ZONE_A):
        _publish(stack, ZONE_B, B_DOCS)
        _publish(stack, ZONE_A, A_DOCS)
    b_chunks, a_chunks = _chunk_rows(stack, ZONE_B), _chunk_rows(stack, ZONE_A)
    # One identical text at one path in both zones: same chunk hash (one cached vector), two chunks.
    same_b = [cid for cid, (path, _) in b_chunks.items() if path == "shared/same.txt"]
    same_a = [cid for cid, (path, _) in a_chunks.items() if path == "shared/same.txt"]
    assert [b_chunks[c][1] for c in same_b] == [a_chunks[c][1] for c in same_a] and set(same_a) != set(same_b)
    with psycopg.connect(stack.settings.postgres.dsn) as conn:
        keys = {cid: _embedding_key(conn, cid) for cid in same_a + same_b}
        assert len(set(keys.values())) == len(same_b)  # A's chunk and B's embed the same text
        cached = conn.execute("SELECT count(*) FROM shardfuse.embedding_cache WHERE chunk_hash = ANY(%s)",
                              (list(set(keys.values())),)).fetchone()
    assert cached == (len(same_b),)  # one cached vector serves both zones

    for query in QUERIES:
        for mode in MODES:
            # Zone A first: fills the query-embedding LRU/Redis entry and a result-cache entry for A.
            a_answer = stack.search(query, ZONE_A, k=10, mode=mode)
            assert set(_ids(a_answer["results"])) <= set(a_chunks)
            first = stack.search(query, ZONE_B, k=10, mode=mode)
            again = stack.search(query, ZONE_B, k=10, mode=mode)
            uncached = stack.search(query, ZONE_B, k=10, mode=mode, cache=False)
            assert first["cache"] == "miss" and again["cache"] == "hit", (query, mode)
            for answer in (first, again):
                assert _ids(answer["results"]) == _ids(uncached["results"]), (query, mode)
                assert set(_ids(answer["results"])) <= set(b_chunks)
                assert all(h["zone"] == ZONE_B and MARKER not in h["text"] for h in answer["results"])
    top = stack.search("kestrel feeds at dawn", ZONE_B, k=1, mode="semantic")["results"][0]
    assert (top["chunk_id"], top["path"], top["zone"]) == (same_b[0], "shared/same.txt", ZONE_B)


def test_the_repeated_chunk_registry_is_per_zone(stack: Stack) -> None:
    """A chunk zone A indexed first is not 'repeated' in zone B; within a zone, a second path repeats it.
    Through prepare_chunks (what ingest runs) against the stack's Redis, with the entropy filter on."""
    settings = Settings.model_validate({
        "entropy": {"enabled": True, "min_tokens": 0, "threshold": 0.0, "min_entropy_bits": 0.0},
        "chunking": {"max_tokens": 48, "overlap_tokens": 0}})
    text = "\n\n".join(
        f"# Section {n}\n\n" + " ".join(f"{word}{n}" for word in ("licence", "grant", "warranty", "liability",
                                                                   "copyright", "holder", "permission", "notice"))
        for n in range(4)
    )
    client = redis.Redis.from_url(stack.settings.broker.url)
    registry = RedisChunkRegistry(client)
    run = uuid.uuid4().hex[:8]
    zone_a, zone_b = f"reg-a-{run}", f"reg-b-{run}"
    counter = TokenCounter(settings.chunking.encoding)

    def prepare(zone: str, path: str) -> dict[str, int]:
        prepared = prepare_chunks(text, path=path, doc_hash="h", settings=settings, counter=counter,
                                  registry=registry, zone=zone)
        assert len(prepared.candidates) >= 3
        return prepared.dropped

    try:
        assert prepare(zone_a, "vendor/LICENSE.md").get("repeated", 0) == 0
        assert prepare(zone_b, "vendor/LICENSE.md").get("repeated", 0) == 0  # same path, other zone
        assert prepare(zone_b, "copy/LICENSE.md").get("repeated", 0) > 0  # zone B's own repeat
        assert prepare(f"reg-c-{run}", "copy/LICENSE.md").get("repeated", 0) == 0  # another zone again
        assert prepare(zone_a, "vendor/LICENSE.md").get("repeated", 0) == 0  # re-publishing: its own claims
    finally:
        for zone in (zone_a, zone_b, f"reg-c-{run}"):
            registry.forget(zone)
        client.close()


def test_explain_chunks_and_dead_letters_keep_zones_apart(stack: Stack, tmp_path: Path) -> None:
    source = tmp_path / "same.txt"
    source.write_text(B_DOCS["shared/same.txt"] * 3)
    env = {**stack.env, "SHARDFUSE_ENTROPY__ENABLED": "true"}
    outputs = {}
    for zone in (ZONE_A, ZONE_B):
        proc = subprocess.run([sys.executable, "-m", "shardfuse.workers.cli.main", "explain-chunks", str(source),
                               "--zone",
                               zone, "--as", "shared/same.txt", "--json"], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=180, check=True)  # fmt: skip
        outputs[zone] = [json.loads(line) for line in proc.stdout.splitlines()]
    assert outputs[ZONE_A] == outputs[ZONE_B] and outputs[ZONE_B]
    assert not any("repeated" in row["fate"] for row in outputs[ZONE_B])

    from shardfuse.workers.app import create_app
    from shardfuse.workers.names import Task

    app = create_app(stack.settings)
    run = uuid.uuid4().hex[:6]
    zones = (f"dl-a-{run}", f"dl-b-{run}")
    for zone in zones:  # the same path in both zones, its content never stored: dead-lettered at once
        app.send_task(Task.INGEST.value, kwargs={"event": {
            "op": "write", "zone": zone, "path": "same/missing.txt", "content_hash": "sha256:" + "d" * 64,
            "size": 1, "seq": 1}})
    stack.wait()
    listed = {zone: json.loads(stack.cli("deadletters", "list", "--zone", zone, "--json").stdout) for zone in zones}
    assert [(row["zone"], row["path"]) for row in listed[zones[1]]] == [(zones[1], "same/missing.txt")]
    assert [(row["zone"], row["path"]) for row in listed[zones[0]]] == [(zones[0], "same/missing.txt")]
    assert "purged 1 dead letter(s)" in stack.cli("deadletters", "purge", "--zone", zones[1], "--yes").stdout
    assert json.loads(stack.cli("deadletters", "list", "--zone", zones[1], "--json").stdout) == []
    assert len(json.loads(stack.cli("deadletters", "list", "--zone", zones[0], "--json").stdout)) == 1
    stack.cli("deadletters", "purge", "--zone", zones[0], "--yes")


# The content type the forged messages claim: YAML, which Celery can decode (JSON text is valid YAML) but
# which the app does not accept. Were any type but JSON accepted, these messages would run.
FORGED_CONTENT_TYPE = "application/x-yaml"
ZONE_FORGED = "sec-forged"


def _envelope(body: bytes, queue: str, task: str | None, *, content_type: str) -> dict[str, Any]:
    """A message as kombu's Redis transport stores it."""
    return {
        "body": base64.b64encode(body).decode("ascii"),
        "content-encoding": "utf-8",
        "content-type": content_type,
        "headers": _task_headers(task) if task else {},
        "properties": {"delivery_mode": 2, "delivery_info": {"exchange": "", "routing_key": queue}, "priority": 0,
                       "body_encoding": "base64", "delivery_tag": str(uuid.uuid4())},
    }


def _task_headers(task: str) -> dict[str, Any]:
    task_id = str(uuid.uuid4())
    return {"lang": "py", "task": task, "id": task_id, "root_id": task_id, "parent_id": None, "group": None,
            "retries": 0, "eta": None, "expires": None, "timelimit": [None, None], "argsrepr": "()",
            "kwargsrepr": "{}", "origin": "test_security"}


def _ingest_body(settings: Settings, name: str) -> bytes:
    """The JSON body of an ingest task for a document of its own, holding the word ``<name>term``."""
    from shardfuse.pipeline.core.events import Op, WriteEvent
    from shardfuse.pipeline.storage.cas import LocalContentStore

    data = f"a document only a {name}term message would index".encode()
    digest = LocalContentStore(settings.cas_root).put(data)
    event = WriteEvent(op=Op.WRITE, zone=ZONE_FORGED, path=f"{name}.txt", content_hash=digest, size=len(data),
                       seq=time.time_ns())
    return json.dumps([[], {"event": event.model_dump(mode="json")}, {}]).encode()


def test_a_message_that_is_not_json_is_refused_and_never_run(stack: Stack) -> None:
    from shardfuse.workers import monitor
    from shardfuse.workers.names import Queue, Task

    before = {name: comp.pid for name, comp in stack.state.components.items()}
    sends = [  # (queue, task header or None for a message without Celery's headers, name)
        (Queue.INGEST, Task.INGEST, "ingest"), (Queue.INGEST, None, "headerless"),
        (Queue.EMBED, Task.EMBED, "embed"), (Queue.QUERY, Task.SEARCH, "query"),
    ]
    # What an attacker with access to the broker does: push a forged envelope straight onto the queue list
    # (kombu's Redis layout). The control is the same kind of envelope declared as JSON: it is live, and runs.
    client = monitor.broker_client(stack.settings)
    forged_items: dict[str, bytes] = {}
    try:
        control = _envelope(_ingest_body(stack.settings, "control"), Queue.INGEST.value, Task.INGEST.value,
                            content_type="application/json")
        client.lpush(Queue.INGEST.value, json.dumps(control))
        for queue, task, name in sends:
            forged = _envelope(_ingest_body(stack.settings, name), queue.value, task.value if task else None,
                               content_type=FORGED_CONTENT_TYPE)
            forged_items[name] = json.dumps(forged).encode()
            client.lpush(queue.value, forged_items[name])
    finally:
        client.close()
    with stack.publisher() as publisher:  # a good event behind the bad ones
        publisher.write(zone="sec-json", path="fine.txt", data=b"a healthy jsononlyterm document")
    stack.wait()  # ingest, embed and maintenance hold nothing waiting or in flight
    assert [hit["path"] for hit in stack.search("jsononlyterm", "sec-json", mode="keyword")["results"]] == [
        "fine.txt"]
    found = {name: [hit["path"] for hit in stack.search(f"{name}term", ZONE_FORGED, mode="keyword")["results"]]
             for name in ("control", *(name for _, _, name in sends))}
    assert found == {"control": ["control.txt"], **{name: [] for _, _, name in sends}}  # only the JSON one ran
    client = monitor.broker_client(stack.settings)
    try:
        assert monitor.queue_depths(client)[Queue.QUERY.value] == 0
        # A search is acknowledged after its reply is sent (acks_late), so the last one may stay unacked for a
        # moment after the client has its answer (seen once under make test's load); a forged message left
        # unacked would stay there.
        deadline = time.monotonic() + 10
        while (unacked := monitor.unacked_by_queue(client)) and any(unacked.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sum(unacked.values()) == 0, unacked
    finally:
        client.close()
    status = json.loads(stack.cli("status", "--json").stdout)
    assert {name: proc["pid"] for name, proc in status["processes"].items()} == before
    assert all(proc["alive"] for proc in status["processes"].values())
    # Each forged message was set aside by the transport, before Celery saw it, with its reason
    # (workers/broker/envelope.py), in shardfuse:unreadable: none was dropped unrecorded.
    client = monitor.broker_client(stack.settings)
    try:
        records = [json.loads(raw) for raw in client.lrange(UNREADABLE_KEY, 0, -1)]
    finally:
        client.close()
    aside = {base64.b64decode(record["message"]): record for record in records}
    for name, item in forged_items.items():
        assert item in aside, f"the forged {name} message was not set aside"
        assert aside[item]["reason"], name
    reasons = {name: aside[item]["reason"] for name, item in forged_items.items() if name != "headerless"}
    assert all(FORGED_CONTENT_TYPE in reason for reason in reasons.values()), reasons


INJECTIONS = [
    "x'; DROP TABLE shard_0.chunks; --",
    '"; DROP SCHEMA shard_1 CASCADE; --',
    "zone') OR 1=1 --",
    "back\\slash\\' OR '1'='1",
    "50%_off\\%",
]


def test_injection_strings_are_only_ever_literal_values(stack: Stack) -> None:
    """As paths, metadata, filter values, query text and zone names, through publish → index → search →
    status/dead letters: every one is data. The tables stay, and each filter matches exactly its document."""
    from shardfuse.workers.app import create_app
    from shardfuse.workers.names import Task

    zone = "sec-inj"
    docs = {f"{text}/doc{i}.txt": (f"injected document {i} inj{i}word mentions {text}", {"label": text, "i": i})
            for i, text in enumerate(INJECTIONS)}
    docs["plain/doc.txt"] = ("injected document plain", {"label": "plain", "i": -1})
    with stack.publisher() as publisher:
        for path, (text, metadata) in docs.items():
            publisher.write(zone=zone, path=path, data=text.encode(), metadata=metadata)
        publisher.write(zone=zone, path="nul/content.bin", data=b"injected\x00document with a NUL")
    app = create_app(stack.settings)
    for i, text in enumerate(INJECTIONS):  # as zone names: refused at the edge, dead-lettered as given
        app.send_task(Task.INGEST.value, kwargs={"event": {"op": "write", "zone": text, "path": f"z{i}.txt",
                                                           "content_hash": "sha256:" + "e" * 64, "seq": 1}})
    stack.wait()

    def paths(**kwargs: Any) -> list[str]:
        return sorted(h["path"] for h in stack.search("injected document", zone, k=50, cache=False,
                                                      **kwargs)["results"])

    assert paths(mode="keyword") == sorted(docs)
    for i, text in enumerate(INJECTIONS):
        expected = [f"{text}/doc{i}.txt"]
        for mode in MODES:
            assert paths(mode=mode, path_prefix=text) == expected, (text, mode)
            assert paths(mode=mode, filters={"label": text}) == expected, (text, mode)
            assert paths(mode=mode, filters={"label": text, "i": i}) == expected, (text, mode)
            assert paths(mode=mode, filters={"label": text + "x"}) == [], (text, mode)
        hits = stack.search(text, zone, k=5, mode="keyword", cache=False)["results"]  # as query text
        assert all(h["zone"] == zone for h in hits)
        assert stack.search(f"inj{i}word", zone, k=1, mode="keyword")["results"][0]["text"].endswith(text)
    # LIKE's wildcards in a prefix are literal characters: "5_%" matches no path, "50%" only its own.
    assert paths(mode="hybrid", path_prefix="5_%") == [] and paths(mode="hybrid", path_prefix="%") == []
    assert paths(mode="hybrid", path_prefix="50%") == [f"{INJECTIONS[4]}/doc4.txt"]
    assert paths(mode="hybrid", filters={"label": "zone') OR 1=1 --x"}) == []
    with pytest.raises(Exception, match="zone") as refused:  # as a search's zone: refused, never run
        stack.search("injected document", INJECTIONS[0])
    assert type(refused.value).__name__ == "InvalidQueryError"
    for bad in ({"path_prefix": "a\x00b"}, {"filters": {"label": "a\x00b"}}):  # NUL: refused, not a DB error
        with pytest.raises(Exception, match="NUL") as refused:
            stack.search("injected document", zone, **bad)
        assert type(refused.value).__name__ == "InvalidQueryError", refused.value

    with psycopg.connect(stack.settings.postgres.dsn) as conn:
        for shard in range(stack.settings.shards):
            for table in ("chunks", "documents"):
                assert conn.execute("SELECT to_regclass(%s)", (f"shard_{shard}.{table}",)).fetchone() != (None,)
        assert conn.execute("SELECT to_regclass('shardfuse.deadletters')").fetchone() != (None,)
        stored: dict[str, str] = dict(conn.execute(
            "SELECT path, metadata->>'label' FROM shard_0.documents WHERE zone = %s UNION ALL "
            "SELECT path, metadata->>'label' FROM shard_1.documents WHERE zone = %s", (zone, zone)).fetchall())
    assert {path: stored[path] for path in docs} == {path: meta["label"] for path, (_, meta) in docs.items()}
    status = json.loads(stack.cli("status", "--json").stdout)
    rows = [z for shard in status["shard_counts"] for z in shard["zones"] if z["zone"] == zone]
    assert (sum(z["documents"] for z in rows), sum(z["skipped"] for z in rows)) == (len(docs), 1)  # NUL content
    for text in INJECTIONS:  # the zone column holds the string as given; listing and purging by it are exact
        listed = json.loads(stack.cli("deadletters", "list", "--zone", text, "--json").stdout)
        assert [(row["zone"], row["error_class"].rsplit(".", 1)[-1]) for row in listed] == [
            (text, "InvalidEventError")], text
        assert "purged 1 dead letter(s)" in stack.cli("deadletters", "purge", "--zone", text, "--yes").stdout
