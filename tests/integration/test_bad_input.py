"""Bad input against the real stack (issue 6, "Bad input"): a batch mixing every kind of bad event and bad
file with good ones. Each good document is indexed, each bad one has a dead letter or a skipped row with
its reason, the ingest worker keeps running, and bad queries get clear errors or empty answers.

Raw malformed events go straight onto the ingest queue as ``shardfuse.ingest`` messages (``events=[…]``,
the format ``workers/publishing.py`` sends); bad files go through the CAS and the real publisher. One
module-scoped fixture publishes everything once and waits; the tests read what it left. Everything lives in
a zone of its own, and the two large documents are deleted again at the end (later BM25 rebuilds of the
shared shards stay small).

Raw events carrying a NUL are in the mixed message: validation refuses them and their dead letter is
stored with each NUL spelled ``\\u0000``. Raw events carrying a lone surrogate or a NaN are not: validation
refuses them too, but their dead letter cannot be written at all (PostgreSQL's ``jsonb`` refuses both, and
the surrogate cannot even be encoded for the ``path`` column), the task fails and the message is
acknowledged, taking the dead letters of the message's other bad events with it. They travel in messages
of their own in ``test_a_raw_event_postgres_cannot_store_still_gets_a_dead_letter`` (an expected failure
until ``pipeline/admin/dead_letters.py`` handles them).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.pipeline.index.store.schema import SHARED_SCHEMA
from shardfuse.pipeline.storage.cas import LocalContentStore
from tests.integration.conftest import Stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

MARK = uuid.uuid4().hex[:10]
ZONE = f"badinput-{MARK}"
LIMIT = 10 * 1024 * 1024  # limits.max_file_bytes (the default, which the session's stack keeps)
TEN_MB = 10_000_000
SECTIONS = 10_000


def _ten_mb_line() -> bytes:
    """10,000,000 bytes, one line, no newline: words as a minifier leaves them, with a marker first."""
    body = " ".join(f"w{i % 9973}x" for i in range(1_700_000))
    return ("badinputtenmb " + body)[:TEN_MB].encode()


def _sections() -> bytes:
    """A Markdown document the semantic chunker cuts into exactly one chunk per section: 10,000 chunks."""
    return "".join(f"# Section {i}\n\nSection {i} is about badinputsection{i} alone.\n\n"
                   for i in range(SECTIONS)).encode()


GOOD_FILES: dict[str, bytes] = {
    "good/plain.txt": b"a plain healthy document about the badinputplain",
    "good/\u202egnp.exe.txt": "right to left \u202eoverride\u202c and \u200fmark\u200f badinputrtl".encode(),
    "good/cafe\u0301.md": "NFD cafe\u0301 with a combining acute, Z\u0351\u0352\u0353algo badinputnfd".encode(),
    "good/caf\u00e9.md": "NFC caf\u00e9, precomposed: another path than its NFD twin badinputnfc".encode(),
    "good/\U0001f9d1\u200d\U0001f680 emoji.txt": "an emoji path \U0001f680 badinputemoji".encode(),
}
BIG_FILES = {"good/minified.js": _ten_mb_line, "good/sections.md": _sections}

BAD_FILES: dict[str, tuple[bytes, str]] = {
    "bad/image.png": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)),
                      "binary content (NUL byte at offset 8)"),
    "bad/nul-laden.txt": (b"text that holds\x00a NUL", "binary content (NUL byte at offset 15)"),
    "bad/controls.txt": (bytes(range(1, 32)) * 40,
                         "binary content (1,000 of the first 1,240 bytes are control characters, more than 10%)"),
    "bad/latin1.txt": ("caf\u00e9 au lait".encode("latin-1"), "not valid UTF-8 (invalid byte 0xe9 at offset 3)"),
    "bad/surrogate-bytes.txt": (b"a \xed\xa0\x80 lone surrogate", "not valid UTF-8 (invalid byte 0xed at offset 2)"),
    "bad/utf16.txt": (codecs.BOM_UTF16_LE + "ab".encode("utf-16-le") + b"\x00\xd8" + "cd".encode("utf-16-le"),
                      "not valid UTF-16-LE despite its byte-order mark (illegal UTF-16 surrogate at byte offset 6)"),
    "bad/empty.txt": (b"", "empty file"),
    "bad/bom-only.txt": (codecs.BOM_UTF8, "empty file (only a byte-order mark)"),
    "bad/blank.txt": (b" \t\r\n" * 100, "no text to index (whitespace only)"),
    "bad/ten-mb-of-spaces.txt": (b" " * TEN_MB, "no text to index (whitespace only)"),
    "bad/too-large.txt": (b"x" * (LIMIT + 1), "too large: 10,485,761 bytes > limit 10,485,760"),
}
# A 10 MB line that is one run of whitespace between two words: tiktoken panics on it.
CRASH_PATH = "bad/whitespace-run.txt"
CRASH_DATA = b"x" + b" " * (TEN_MB - 2) + b"y"


@dataclass
class Published:
    good: dict[str, bytes] = field(default_factory=dict)  # path -> content, every document that must index
    dead: list[tuple[dict[str, Any], str, str]] = field(default_factory=list)  # payload, error class, reason
    baseline_dead_id: int = 0
    ingest_log_offset: int = 0
    timings: dict[str, float] = field(default_factory=dict)


def _raw_bad_events(good_hash: str) -> list[tuple[Any, str, str]]:
    """(raw event, error class, reason fragment) for every malformed event the ingest queue can receive."""
    def event(name: str, **changes: Any) -> dict[str, Any]:
        raw: dict[str, Any] = {"event_id": f"{MARK}-{name}", "op": "write", "zone": ZONE, "path": f"bad/{name}.txt",
                               "content_hash": good_hash, "size": 1, "seq": 1}
        raw.update(changes)
        return raw

    def without(name: str, key: str) -> dict[str, Any]:
        raw = event(name)
        del raw[key]
        return raw

    missing = "sha256:" + hashlib.sha256(MARK.encode()).hexdigest()  # never put in the CAS
    invalid = "InvalidEventError"
    return [
        (f"{{not json {MARK}", invalid, "invalid write event: event: Invalid JSON"),
        (42, invalid, "invalid write event: an event is a JSON object (or its JSON text), not int 42"),
        (f'["{MARK}"]', invalid, "invalid write event: event: Input should be an object"),
        (without("no-zone", "zone"), invalid, "invalid write event: zone: Field required"),
        (without("no-seq", "seq"), invalid, "invalid write event: seq: Field required"),
        (without("no-op", "op"), invalid, "invalid write event: op: Field required"),
        (without("no-hash", "content_hash"), invalid, "a write event needs content_hash"),
        (event("seq-string", seq="7"), invalid, "seq: Input should be a valid integer"),
        (event("seq-bool", seq=True), invalid, "seq: Input should be a valid integer"),
        (event("seq-float", seq=1.5), invalid, "seq: Input should be a valid integer"),
        (event("seq-bigint", seq=2**63), invalid, "seq: Input should be less than or equal to 9223372036854775807"),
        (event("size-string", size="big"), invalid, "size: Input should be a valid integer"),
        (event("path-int", path=5), invalid, "path: Input should be a valid string"),
        (event("metadata-list", metadata=["a"]), invalid, "metadata: Input should be a valid dictionary"),
        (event("op-rename", op="rename"), invalid, "op: Input should be 'write' or 'delete'"),
        (event("extra-field", surprise=1), invalid, "surprise: Extra inputs are not permitted"),
        (event("zone-traversal", zone="../etc"), invalid, "zone: '../etc' is not a zone name"),
        (event("hash-short", content_hash="sha256:abc"), invalid,
         "content_hash: 'sha256:abc' is not a content hash: 'sha256:' followed by 64 lowercase hex digits"),
        (event("hash-upper", content_hash=good_hash.upper().replace("SHA256", "sha256")), invalid,
         "is not a content hash"),
        (event("hash-traversal", content_hash="sha256:../../etc/passwd"), invalid,
         "content_hash: 'sha256:../../etc/passwd' is not a content hash"),
        (event("hash-bare-traversal", content_hash="../../etc/passwd"), invalid,
         "content_hash: '../../etc/passwd' is not a content hash"),
        (event("hash-missing", content_hash=missing), "ContentNotFoundError",
         f"holds no content {missing}: put the content in the CAS before publishing its event"),
        (event("nul-path", path="bad/nul\x00.txt"), invalid, "path: contains a NUL character at index 7"),
        (event("nul-metadata", metadata={"team": "a\x00b"}), invalid,
         "metadata: team contains a NUL character at index 1"),
    ]


def _as_stored(value: Any) -> Any:
    """A payload as the dead-letter table keeps it: every NUL spelled as the six characters ``\\u0000``."""
    if isinstance(value, str):
        return value.replace("\x00", "\\u0000")
    if isinstance(value, dict):
        return {_as_stored(k): _as_stored(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_stored(v) for v in value]
    return value


def _dead_letters_after(stack: Stack, baseline: int) -> list[dict[str, Any]]:
    with psycopg.connect(stack.settings.postgres.dsn) as conn:
        rows = conn.execute(
            f"SELECT id, payload, zone, path, error_class, reason, attempts FROM {SHARED_SCHEMA}.deadletters "
            "WHERE id > %s ORDER BY id", (baseline,)).fetchall()
    keys = ("id", "payload", "zone", "path", "error_class", "reason", "attempts")
    return [dict(zip(keys, row, strict=True)) for row in rows]


def _documents(stack: Stack) -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {}
    with psycopg.connect(stack.settings.postgres.dsn) as conn:
        for shard in range(stack.settings.shards):
            rows = conn.execute(
                f"SELECT d.path, d.status, d.reason, d.chunk_count, "
                f"(SELECT count(*) FROM shard_{shard}.chunks c WHERE c.zone = d.zone AND c.path = d.path) "
                f"FROM shard_{shard}.documents d WHERE d.zone = %s", (ZONE,)).fetchall()
            for path, status, reason, chunk_count, chunk_rows in rows:
                docs[path] = {"status": status, "reason": reason, "chunk_count": chunk_count, "chunks": chunk_rows,
                              "shard": shard}
    return docs


def _wait_until(stack: Stack, done: Callable[[], bool], *, timeout: float = 540) -> None:
    """``stack.wait()`` until ``done()``. The broker can look idle for a moment while a worker takes a large
    message (kombu's Redis transport pops it, then records it as unacknowledged: 10 MB of chunks take a
    while), so an idle pipeline is checked against the outcomes it should have produced. Gives up after
    ``timeout``; the test's assertions then say what is missing."""
    deadline = time.monotonic() + timeout
    while True:
        stack.wait(timeout=max(1.0, deadline - time.monotonic()))
        if done():
            stack.wait()  # a commit seen by done() marks its shard's BM25 stale: wait for the rebuild too
            return
        if time.monotonic() > deadline:
            return
        time.sleep(1)


def _settled_count(stack: Stack, baseline_dead_id: int) -> int:
    """Documents of the zone in a final state, plus dead letters recorded since ``baseline_dead_id``."""
    docs = _documents(stack)
    return (sum(doc["status"] in ("indexed", "skipped") for doc in docs.values())
            + len(_dead_letters_after(stack, baseline_dead_id)))


def _ingest_log(stack: Stack) -> str:
    from shardfuse.workers.stack.layout import StackLayout

    return StackLayout(stack.settings.data_path).log_file("worker-ingest").read_text(errors="replace")


def _task_seconds(log: str, task_id: str) -> float | None:
    match = re.search(rf"Task shardfuse\.ingest\[{task_id}\] succeeded in ([0-9.]+)s", log)
    return float(match.group(1)) if match else None


@pytest.fixture(scope="module")
def published(stack: Stack) -> Iterator[Published]:
    from shardfuse.workers.app import create_app
    from shardfuse.workers.names import Task

    app = create_app(stack.settings)
    cas = LocalContentStore(stack.settings.cas_root)
    record = Published(ingest_log_offset=len(_ingest_log(stack)))
    record.baseline_dead_id = max([0] + [row["id"] for row in _dead_letters_after(stack, 0)])
    started = time.perf_counter()

    # 1. Good and bad files through the CAS and the real publisher (16 events a message).
    with stack.publisher() as publisher:
        for path, data in GOOD_FILES.items():
            publisher.write(zone=ZONE, path=path, data=data)
            record.good[path] = data
        for path, (data, _) in BAD_FILES.items():
            publisher.write(zone=ZONE, path=path, data=data)
        crash = publisher.write(zone=ZONE, path=CRASH_PATH, data=CRASH_DATA)
    record.dead.append(({"event": crash.model_dump(mode="json")}, "UnprocessableContentError",
                        "the tokenizer crashed on this content (PanicException"))

    # 2. One raw message mixing every malformed event with good ones, first and last.
    def raw_good(path: str, data: bytes) -> dict[str, Any]:
        record.good[path] = data
        return {"op": "write", "zone": ZONE, "path": path, "content_hash": cas.put(data), "size": len(data),
                "seq": 1}

    bad = _raw_bad_events(cas.put(b"content that exists"))
    events = [raw_good("good/raw-first.txt", b"first good event of the mixed message badinputrawfirst"),
              *(raw for raw, _, _ in bad),
              raw_good("good/raw-last.txt", b"last good event of the mixed message badinputrawlast")]
    app.send_task(Task.INGEST.value, kwargs={"events": events})
    record.dead.extend((_as_stored({"event": raw}), error, reason) for raw, error, reason in bad)

    # 3. The two large documents, each in a message of its own so its ingest time can be read from the log.
    big_tasks = {}
    for path, make in BIG_FILES.items():
        data = make()
        big_tasks[path] = app.send_task(Task.INGEST.value, kwargs={"events": [raw_good(path, data)]}).id
    expected = len(record.good) + len(BAD_FILES) + len(record.dead)
    _wait_until(stack, lambda: _settled_count(stack, record.baseline_dead_id) >= expected)
    record.timings["publish_to_settled_s"] = round(time.perf_counter() - started, 1)
    log = _ingest_log(stack)
    for path, task_id in big_tasks.items():
        seconds = _task_seconds(log, task_id)
        if seconds is not None:
            record.timings[f"ingest_task_s[{path}]"] = seconds
    print(f"bad-input timings: {json.dumps(record.timings)}")
    yield record

    with stack.publisher() as publisher:  # keep later BM25 rebuilds of the shared shards small
        for path in BIG_FILES:
            publisher.delete(zone=ZONE, path=path)
    stack.wait(timeout=300)


def test_every_good_document_is_indexed_whole(stack: Stack, published: Published) -> None:
    docs = _documents(stack)
    indexed = {path for path, doc in docs.items() if doc["status"] == "indexed"}
    assert indexed == set(published.good), sorted(indexed ^ set(published.good))
    assert len(indexed) == len(GOOD_FILES) + len(BIG_FILES) + 2  # the two raw good events of the mixed message
    for doc in docs.values():
        if doc["status"] == "indexed":
            assert doc["chunk_count"] == doc["chunks"] > 0
    assert docs["good/sections.md"]["chunks"] == SECTIONS
    assert docs["good/minified.js"]["chunks"] > 1000
    # Odd Unicode paths come back exactly, and find their text.
    for term, path in [("badinputrtl", "good/\u202egnp.exe.txt"), ("badinputnfd", "good/cafe\u0301.md"),
                       ("badinputnfc", "good/caf\u00e9.md"),
                       ("badinputemoji", "good/\U0001f9d1\u200d\U0001f680 emoji.txt"),
                       ("badinputtenmb", "good/minified.js"), ("badinputsection9999", "good/sections.md"),
                       ("badinputrawfirst", "good/raw-first.txt"), ("badinputrawlast", "good/raw-last.txt")]:
        hits = stack.search(term, ZONE, mode="keyword", k=3)["results"]
        assert [h["path"] for h in hits][:1] == [path], (term, hits)


def test_every_bad_file_is_a_skipped_row_with_its_reason(stack: Stack, published: Published) -> None:
    docs = _documents(stack)
    skipped = {path: doc["reason"] for path, doc in docs.items() if doc["status"] == "skipped"}
    assert skipped == {path: reason for path, (_, reason) in BAD_FILES.items()}
    assert all(docs[path]["chunks"] == 0 for path in skipped)
    status = json.loads(stack.cli("status", "--json").stdout)
    shown = {row["path"]: row["reason"] for row in status["skipped"] if row["zone"] == ZONE}
    assert shown.items() <= skipped.items() and shown


def test_every_bad_event_has_exactly_one_dead_letter_with_its_reason(stack: Stack, published: Published) -> None:
    rows = _dead_letters_after(stack, published.baseline_dead_id)
    for payload, error_class, reason in published.dead:
        matching = [row for row in rows if row["payload"] == payload]
        assert len(matching) == 1, (payload, matching)
        row = matching[0]
        assert row["error_class"].endswith(error_class), row
        assert reason in row["reason"], row
        assert row["attempts"] == 1, row  # permanent: dead-lettered at once, never retried
    # Nothing else of this test was dead-lettered: no good document, and no bad one twice.
    ours = [row for row in rows if row["zone"] == ZONE or MARK in json.dumps(row["payload"])
            or row["payload"] == {"event": 42}]
    assert len(ours) == len(published.dead), [(row["path"], row["reason"]) for row in ours]
    # ... and the CLI lists them with their zone and path where the event had one.
    listed = json.loads(stack.cli("deadletters", "list", "--zone", ZONE, "--json", "--limit", "500").stdout)
    assert {row["path"] for row in listed} >= {CRASH_PATH, "bad/hash-missing.txt", "bad/hash-traversal.txt"}
    crash = next(row for row in listed if row["path"] == CRASH_PATH)
    assert "its longest run of whitespace is 9,999,998 characters, at character 1" in crash["reason"]


def test_the_ingest_worker_kept_running_and_still_indexes(stack: Stack, published: Published) -> None:
    status = json.loads(stack.cli("status", "--json").stdout)
    assert {name: proc["pid"] for name, proc in status["processes"].items()} == {
        name: comp.pid for name, comp in stack.state.components.items()}
    assert all(proc["alive"] for proc in status["processes"].values()), status["processes"]
    since = _ingest_log(stack)[published.ingest_log_offset:]
    assert "WorkerLostError" not in since and "exited with" not in since
    with stack.publisher() as publisher:
        publisher.write(zone=ZONE, path="good/after.txt", data=b"written after the bad batch badinputafter")
    _wait_until(stack, lambda: _documents(stack).get("good/after.txt", {}).get("status") == "indexed")
    assert [h["path"] for h in stack.search("badinputafter", ZONE, mode="keyword")["results"]] == ["good/after.txt"]


# --- queries ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"query": ""}, "query must be a non-empty string"),
        ({"query": "   "}, "query must be a non-empty string"),
        ({"query": "x" * 102_400}, "query is 102,400 characters; the limit is 4,096: shorten it"),
        ({"k": 0}, "k must be an integer from 1 to 1000, got 0"),
        ({"k": 10**6}, "k must be an integer from 1 to 1000, got 1000000"),
        ({"mode": "fuzzy"}, "unknown mode 'fuzzy'; choose one of hybrid, keyword, semantic"),
        ({"zone": "bad zone!"}, "zone 'bad zone!' is not a zone name"),
        ({"query": "caf\ud800"}, "query contains a lone surrogate U+D800 at index 3"),
        ({"limit": 5}, "unknown search argument(s) 'limit'"),
    ],
    ids=["empty", "blank", "100kb", "k-0", "k-1e6", "mode", "zone", "surrogate", "unknown-argument"],
)
def test_bad_queries_get_a_clear_error_through_the_rpc(stack: Stack, published: Published,
                                                       kwargs: dict[str, Any], message: str) -> None:
    args = {"query": "badinputplain", "zone": ZONE, **kwargs}
    with pytest.raises(InvalidQueryError) as info:
        stack.search(**args)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["", "--zone", ZONE], "shardfuse search: query must be a non-empty string"),
        (["x" * 102_400, "--zone", ZONE], "shardfuse search: query is 102,400 characters; the limit is 4,096"),
        (["q", "--zone", ZONE, "-k", "0"], "shardfuse search: k must be an integer from 1 to 1000, got 0"),
        (["q", "--zone", ZONE, "-k", "1000000"], "shardfuse search: k must be an integer from 1 to 1000, got 1000000"),
        (["q", "--zone", ZONE, "--mode", "fuzzy"], "argument --mode: invalid choice: 'fuzzy'"),
        (["q", "--zone", "../etc"], "shardfuse search: error: argument --zone: '../etc' is not a zone name"),
    ],
    ids=["empty", "100kb", "k-0", "k-1e6", "mode", "zone"],
)
def test_bad_queries_get_a_clear_error_from_the_cli(stack: Stack, published: Published, argv: list[str],
                                                    message: str) -> None:
    proc = stack.cli("search", *argv, check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_an_unknown_zone_answers_empty(stack: Stack, published: Published) -> None:
    unknown = f"badinput-never-{MARK}"
    for mode in ("hybrid", "keyword", "semantic"):
        assert stack.search("badinputplain", unknown, mode=mode)["results"] == [], mode
    proc = stack.cli("search", "badinputplain", "--zone", unknown)
    assert proc.stdout.startswith(f"0 result(s) for 'badinputplain' in zone '{unknown}'")
    assert json.loads(stack.cli("search", "q", "--zone", unknown, "--json").stdout)["results"] == []


def test_k_at_its_limit_and_odd_unicode_queries_are_answered(stack: Stack, published: Published) -> None:
    answer = stack.search("badinputsection", ZONE, k=1000, mode="keyword")
    assert len(answer["results"]) > 0 and {h["zone"] for h in answer["results"]} == {ZONE}
    hits = stack.search("\u202eoverride\u202c", ZONE, mode="keyword", k=1)["results"]
    assert [h["path"] for h in hits] == ["good/\u202egnp.exe.txt"]
    assert stack.search("cafe\u0301 Z\u0351\u0352\u0353algo", ZONE, k=3)["results"]


# --- raw messages the dead-letter table and the task signature once could not take -------------------

@pytest.mark.parametrize("changes", [{"path": "bad/\ud800.txt"}, {"metadata": {"score": float("nan")}}],
                         ids=["lone-surrogate-path", "nan-metadata"])
def test_a_raw_event_postgres_cannot_store_still_gets_a_dead_letter(stack: Stack, published: Published,
                                                                    changes: dict[str, Any]) -> None:
    from shardfuse.workers.app import create_app
    from shardfuse.workers.names import Task

    baseline = max([0] + [row["id"] for row in _dead_letters_after(stack, 0)])
    raw = {"event_id": f"{MARK}-unstorable", "op": "write", "zone": ZONE, "path": "bad/unstorable.txt",
           "content_hash": "sha256:" + "a" * 64, "seq": 1, **changes}
    create_app(stack.settings).send_task(Task.INGEST.value, kwargs={"events": [raw]})  # a message of its own
    stack.wait()
    assert any(f"{MARK}-unstorable" in json.dumps(row["payload"]) for row in _dead_letters_after(stack, baseline))


def test_a_message_with_an_unknown_argument_gets_a_dead_letter(stack: Stack, published: Published) -> None:
    from shardfuse.workers.app import create_app
    from shardfuse.workers.names import Task

    baseline = max([0] + [row["id"] for row in _dead_letters_after(stack, 0)])
    create_app(stack.settings).send_task(Task.INGEST.value, kwargs={"evnts": [{"zone": ZONE, "marker": MARK}]})
    stack.wait()
    assert any(MARK in json.dumps(row["payload"]) for row in _dead_letters_after(stack, baseline))


def test_malformed_maintenance_and_embed_messages_get_a_dead_letter_each(stack: Stack, published: Published) -> None:
    """A maintenance message with a bad shard or an unknown argument, and an embed document that is no
    document or names the wrong shard, are dead-lettered with their reason (before: a maintenance message
    failed in Celery's call and was acknowledged unrecorded; a bad embed document was retried as transient)."""
    from shardfuse.pipeline.core.sharding import shard_for
    from shardfuse.workers.app import create_app
    from shardfuse.workers.names import Task

    baseline = max([0] + [row["id"] for row in _dead_letters_after(stack, 0)])
    app = create_app(stack.settings)
    shards = stack.settings.shards
    wrong = (shard_for(ZONE, "misplaced.txt", shards) + 1) % shards
    event = {"op": "delete", "zone": ZONE, "path": "misplaced.txt", "seq": 1}
    sends = [
        (Task.BM25_REBUILD, {"shard": shards}, f"shard must be a shard number from 0 to {shards - 1}, got {shards}"),
        (Task.BM25_REBUILD, {"shard": "0; drop"}, "shard must be a shard number"),
        (Task.VECTOR_INDEX_BUILD, {"shard": 0, "mark": MARK}, "unknown argument(s) mark"),
        (Task.EMBED, {"documents": [{"event": event, "marker": MARK}]}, "malformed embed document"),
        (Task.EMBED, {"documents": [{"event": event, "shard": wrong, "chunks": [], "line_count": 0}]},
         f"names shard {wrong}; its path belongs on shard"),
    ]
    for task, kwargs, _ in sends:
        app.send_task(task.value, kwargs=kwargs)
    stack.wait()
    deadline = time.monotonic() + 30
    while len(rows := _dead_letters_after(stack, baseline)) < len(sends) and time.monotonic() < deadline:
        time.sleep(0.5)
    reasons = [row["reason"] for row in rows]
    for _, _, expected in sends:
        assert sum(expected in reason for reason in reasons) >= 1, (expected, reasons)
    assert all(row["error_class"].endswith("InvalidEventError") and row["attempts"] == 1 for row in rows), rows
