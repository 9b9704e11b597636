"""Bad input on the write side (issue 6, "Bad input"): every malformed event, bad hash, missing content and
unindexable file gets a specific, actionable error or a skip with its reason, and nothing else.

Where ``tests/unit/pipeline/core/test_events.py``, ``test_cas.py`` and ``test_decode.py`` already pin a case, this file
covers what they do not: the whole matrix by field, the messages' wording, what PostgreSQL would refuse
later (NUL, lone surrogates, beyond-bigint integers, non-JSON metadata), and the ingest stage's decisions
for each kind of bad content.
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from shardfuse.pipeline.admin.publisher import Publisher
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import (
    ContentNotFoundError,
    InvalidEventError,
    PermanentError,
    UnprocessableContentError,
)
from shardfuse.pipeline.core.events import MAX_BIGINT, Op, WriteEvent, parse_event
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.index.store import ApplyOutcome, DocumentChange
from shardfuse.pipeline.ingest.stage import IngestOutcome, IngestResult, ingest_event
from shardfuse.pipeline.storage.cas import InMemoryContentStore, LocalContentStore

HASH = "sha256:" + "ab" * 32
SETTINGS = Settings(shards=2)
LIMIT = SETTINGS.limits.max_file_bytes


def _event(**overrides: object) -> dict[str, object]:
    event: dict[str, object] = {"event_id": "e1", "op": "write", "zone": "z", "path": "docs/a.md",
                                "content_hash": HASH, "size": 3, "seq": 7}
    event.update(overrides)
    return {k: v for k, v in event.items() if v is not _DROP}


_DROP = object()


# --- malformed events -------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{not json", "invalid write event: event: Invalid JSON"),
        ("", "invalid write event: event: Invalid JSON: EOF"),
        (b"\xff\xfe{}", "invalid write event: event: Invalid JSON"),
        ('{"op": "write", "zone": "z",', "invalid write event: event: Invalid JSON: EOF"),
        ("null", "invalid write event: event: Input should be an object"),
        ("[1, 2]", "invalid write event: event: Input should be an object"),
        ('"an event"', "invalid write event: event: Input should be an object"),
        (42, "invalid write event: an event is a JSON object (or its JSON text), not int 42"),
        (None, "invalid write event: an event is a JSON object (or its JSON text), not NoneType None"),
        ([_event()], "invalid write event: an event is a JSON object (or its JSON text), not list"),
        (3.5, "not float 3.5"),
    ],
    ids=["not-json", "empty-text", "not-utf8", "truncated", "json-null", "json-array", "json-string", "int",
         "none", "list", "float"],
)
def test_malformed_events_are_invalid_events(raw: object, message: str) -> None:
    with pytest.raises(InvalidEventError) as info:
        parse_event(raw)
    assert str(info.value).startswith(message) or message in str(info.value), str(info.value)
    assert isinstance(info.value, PermanentError)  # dead-lettered at once, never retried


def test_a_huge_malformed_event_gets_a_short_message() -> None:
    with pytest.raises(InvalidEventError) as info:
        parse_event(["x" * 10_000_000])
    assert len(str(info.value)) < 200


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ("op", "op: Field required"),
        ("zone", "zone: Field required"),
        ("path", "path: Field required"),
        ("seq", "seq: Field required"),
        ("content_hash", "a write event needs content_hash"),
    ],
)
def test_missing_fields_are_named(missing: str, message: str) -> None:
    with pytest.raises(InvalidEventError, match=message):
        parse_event(_event(**{missing: _DROP}))


def test_every_problem_of_an_event_is_listed_at_once() -> None:
    with pytest.raises(InvalidEventError) as info:
        parse_event({"op": "write", "path": 5, "seq": "seven"})
    reason = str(info.value)
    assert all(f"{field}:" in reason for field in ("zone", "path", "seq")), reason


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("seq", "7", "seq: Input should be a valid integer"),
        ("seq", True, "seq: Input should be a valid integer"),
        ("seq", 1.0, "seq: Input should be a valid integer"),
        ("seq", 1.5, "seq: Input should be a valid integer"),
        ("seq", -1, "seq: Input should be greater than or equal to 0"),
        ("seq", MAX_BIGINT + 1, "seq: Input should be less than or equal to 9223372036854775807"),
        ("size", "big", "size: Input should be a valid integer"),
        ("size", False, "size: Input should be a valid integer"),
        ("size", 10**30, "size: Input should be less than or equal to"),
        ("op", 1, "op: Input should be 'write' or 'delete'"),
        ("op", "WRITE", "op: Input should be 'write' or 'delete'"),
        ("zone", 5, "zone: 5 is not a zone name"),
        ("zone", "", "zone: '' is not a zone name"),
        ("zone", "../etc", "zone: '../etc' is not a zone name: 1 to 128 letters, digits"),
        ("zone", "z\n", "zone: 'z\\\\n' is not a zone name"),
        ("zone", "x" * 129, "is not a zone name"),
        ("path", 5, "path: Input should be a valid string"),
        ("path", "", "path: String should have at least 1 character"),
        ("path", "p" * 4097, "path: String should have at most 4096 characters"),
        ("event_id", 5, "event_id: Input should be a valid string"),
        ("mime", ["text/plain"], "mime: Input should be a valid string"),
        ("metadata", [1], "metadata: Input should be a valid dictionary"),
        ("metadata", "team=a", "metadata: Input should be a valid dictionary"),
        ("surprise", 1, "surprise: Extra inputs are not permitted"),
    ],
)
def test_wrong_types_and_ranges_name_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(InvalidEventError, match=message):
        parse_event(_event(**{field: value}))
    # The same event as JSON text (what a non-Python producer sends) fails the same way.
    if field != "seq" or value is not True:  # JSON has no "7 as bool" ambiguity to differ on
        with pytest.raises(InvalidEventError, match=message):
            parse_event(json.dumps(_event(**{field: value})))


# --- content hashes ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "bad_hash",
    [
        "sha256:abc",
        "sha256:" + "a" * 63,
        "sha256:" + "a" * 65,
        "sha256:" + "AB" * 32,
        "sha256:" + "g" * 64,
        "ab" * 32,
        "md5:" + "a" * 64,
        "sha256:" + "a" * 64 + "\n",
        "../../etc/passwd",
        "sha256:../../etc/passwd",
        "sha256:" + "../" * 21 + "a",
        "sha256:" + "a" * 62 + "/.",
        "sha256:/" + "a" * 63,
    ],
)
def test_a_hash_that_is_not_64_hex_or_tries_traversal_is_refused(bad_hash: str) -> None:
    with pytest.raises(InvalidEventError) as info:
        parse_event(_event(content_hash=bad_hash))
    assert "content_hash: " in str(info.value)
    assert "is not a content hash: 'sha256:' followed by 64 lowercase hex digits" in str(info.value)


@pytest.mark.parametrize("bad_hash",
                         ["sha256:../../etc/passwd", "../../../../etc/passwd", "sha256:" + "../" * 21 + "a"])
def test_the_cas_never_resolves_a_traversing_hash_to_a_path(tmp_path: Path, bad_hash: str) -> None:
    cas = LocalContentStore(tmp_path / "cas")
    (tmp_path / "secret").write_bytes(b"outside the CAS")
    for call in (cas.get, cas.exists, cas.size, cas.path_for):
        with pytest.raises(InvalidEventError, match="is not 'sha256:' followed by 64 lowercase hex digits"):
            call(bad_hash)


@pytest.mark.parametrize("store", ["local", "memory"])
def test_a_hash_with_no_content_says_what_to_do(tmp_path: Path, store: str) -> None:
    cas = LocalContentStore(tmp_path) if store == "local" else InMemoryContentStore()
    missing = "sha256:" + "d" * 64
    for call in (cas.get, cas.size):
        with pytest.raises(ContentNotFoundError) as info:
            call(missing)
        reason = str(info.value)
        assert missing in reason and "put the content in the CAS before publishing its event" in reason
        assert "shardfuse deadletters retry" in reason


# --- odd Unicode and characters PostgreSQL cannot store ---------------------------------------------------

@pytest.mark.parametrize(
    "path",
    [
        "docs/\u202egnp.exe",  # RIGHT-TO-LEFT OVERRIDE: shown reversed, stored as sent
        "docs/\u200fhebrew-\u05e9\u05dc\u05d5\u05dd.md",  # RLM and Hebrew
        "docs/cafe\u0301.md",  # e + COMBINING ACUTE (NFD)
        "docs/caf\u00e9.md",  # precomposed é (NFC): a different path
        "docs/z\u0351\u0352\u0353\u0354\u0355algo.txt",  # a stack of combining marks
        "docs/\U0001f9d1\u200d\U0001f680.txt",  # ZWJ emoji sequence
        "docs/tab\there.txt",
        "docs/../../etc/passwd",  # a path is a name, never opened: kept as given
    ],
)
def test_odd_unicode_paths_are_kept_exactly(path: str) -> None:
    assert parse_event(_event(path=path)).path == path
    assert parse_event(json.dumps(_event(path=path))).path == path


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"path": "a\x00b"}, "path: contains a NUL character at index 1"),
        ({"path": "docs/\ud800.md"}, "path: contains a lone surrogate U+D800 at index 5, which is not valid Unicode; "
                                     "rename the file to valid UTF-8"),
        ({"path": os.fsdecode(b"docs/caf\xe9.md")}, "path: contains a lone surrogate U+DCE9 at index 8"),
        ({"event_id": "e\udfff"}, "event_id: contains a lone surrogate U+DFFF at index 1, which is not valid Unicode"),
        ({"mime": "text/\x00plain"}, "mime: contains a NUL character at index 5"),
        ({"metadata": {"team": "a\x00b"}}, "metadata: team contains a NUL character at index 1"),
        ({"metadata": {"tags": ["ok", "\ud83d"]}}, "metadata: tags[1] contains a lone surrogate U+D83D"),
        ({"metadata": {"a\x00": 1}}, "metadata: key 'a\\x00' contains a NUL character"),
        ({"metadata": {"n": {"x\udc80": 1}}}, "metadata: n: key 'x\\udc80' contains a lone surrogate"),
        ({"metadata": {"score": float("nan")}}, "metadata: score is nan, which JSON cannot hold"),
        ({"metadata": {"deep": {"x": float("-inf")}}}, "metadata: deep.x is -inf, which JSON cannot hold"),
        ({"metadata": {"when": b"bytes"}}, "metadata: when is a bytes; metadata holds only JSON values"),
        ({"metadata": {"ids": {1, 2}}}, "metadata: ids is a set; metadata holds only JSON values"),
        ({"metadata": {1: "x"}}, "metadata: key 1 is not a string"),
    ],
    ids=["nul-path", "surrogate-path", "undecodable-filename", "surrogate-event-id", "nul-mime", "nul-metadata",
         "surrogate-in-list", "nul-key", "surrogate-key", "nan", "inf", "bytes", "set", "int-key"],
)
def test_what_postgresql_would_refuse_is_refused_at_the_edge(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidEventError) as info:
        parse_event(_event(**overrides))
    assert str(info.value).startswith("invalid write event: ") and message in str(info.value), str(info.value)


def test_nan_in_json_text_metadata_is_refused() -> None:
    text = json.dumps(_event(metadata={"x": 1})).replace('{"x": 1}', '{"x": NaN}')
    with pytest.raises(InvalidEventError, match="metadata: x is nan"):
        parse_event(text)


def test_metadata_nesting_is_bounded() -> None:
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(40):
        node["n"] = {}
        node = node["n"]
    with pytest.raises(InvalidEventError, match="nests deeper than 32 levels"):
        parse_event(_event(metadata=deep))


def test_constructing_a_bad_event_raises_the_same_clear_error() -> None:
    with pytest.raises(InvalidEventError, match="path: contains a lone surrogate"):
        WriteEvent(op=Op.WRITE, zone="z", path="\udcff", content_hash=HASH, seq=1)


def test_the_publisher_refuses_a_bad_path_before_anything_is_sent() -> None:
    cas = InMemoryContentStore()
    sent: list[WriteEvent] = []

    class Sink:
        def send(self, event: WriteEvent) -> None:
            sent.append(event)

    publisher = Publisher(cas=cas, sink=Sink())
    for path, message in [(os.fsdecode(b"bad\xff.txt"), r"lone surrogate U\+DCFF at index 3"),
                          ("a\x00b", "NUL character at index 1")]:
        with pytest.raises(InvalidEventError, match=message):
            publisher.write(zone="z", path=path, data=b"text")
    with pytest.raises(InvalidEventError, match="metadata: x is nan"):
        publisher.write(zone="z", path="ok.txt", data=b"text", metadata={"x": float("nan")})
    with pytest.raises(InvalidEventError, match="zone: 'bad zone' is not a zone name"):
        publisher.delete(zone="bad zone", path="ok.txt")
    assert sent == []


# --- the ingest stage, per kind of bad content ------------------------------------------------------------

class FakeShard:
    def __init__(self, shard: int) -> None:
        self.shard = shard
        self.applied: list[DocumentChange] = []

    def document_seq(self, zone: str, path: str) -> int | None:
        return None

    def apply(self, changes: Sequence[DocumentChange]) -> list[ApplyOutcome]:
        self.applied.extend(changes)
        return [ApplyOutcome(c.key, c.event.seq, True, None) for c in changes]


class CountingCas(InMemoryContentStore):
    """Counts reads, so a test can tell content was never read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def get(self, content_hash: str) -> bytes:
        self.reads += 1
        return super().get(content_hash)


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return TokenCounter()


def _ingest(data: bytes, counter: TokenCounter, *, path: str = "docs/file.txt",
            settings: Settings = SETTINGS) -> tuple[IngestOutcome, CountingCas]:
    cas = CountingCas()
    event = WriteEvent(op=Op.WRITE, zone="z", path=path, content_hash=cas.put(data), size=len(data), seq=1)
    cas.reads = 0
    outcome = ingest_event(event, settings=settings, cas=cas, stores=[FakeShard(0), FakeShard(1)], counter=counter)
    return outcome, cas


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)), "binary content (NUL byte at offset 8)"),
        (b"looks like text\x00but holds a NUL", "binary content (NUL byte at offset 15)"),
        (bytes(range(1, 32)) * 40,
         "binary content (1,000 of the first 1,240 bytes are control characters, more than 10%)"),
        (b"caf\xe9 au lait", "not valid UTF-8 (invalid byte 0xe9 at offset 3)"),
        (b"ok \xc3\x28 broken", "not valid UTF-8 (invalid byte 0xc3 at offset 3)"),
        (b"lone surrogate \xed\xa0\x80 in UTF-8", "not valid UTF-8 (invalid byte 0xed at offset 15)"),
        (b"", "empty file"),
        (codecs.BOM_UTF8, "empty file (only a byte-order mark)"),
        (b" \t\r\n" * 1000, "no text to index (whitespace only)"),
        ("\u3000\u00a0\u2003".encode() * 100, "no text to index (whitespace only)"),
    ],
    ids=["png", "nul-laden", "control-chars", "latin-1", "broken-utf8", "cesu-surrogate", "empty", "bom-only",
         "whitespace", "unicode-whitespace"],
)
def test_unindexable_content_is_skipped_with_its_reason(data: bytes, reason: str, counter: TokenCounter) -> None:
    outcome, _ = _ingest(data, counter)
    assert (outcome.result, outcome.reason) == (IngestResult.SKIPPED, reason)


def test_utf16_with_a_lone_surrogate_is_skipped(counter: TokenCounter) -> None:
    outcome, _ = _ingest(codecs.BOM_UTF16_LE + "ab".encode("utf-16-le") + b"\x00\xd8" + "cd".encode("utf-16-le"),
                         counter)
    assert (outcome.result, outcome.reason) == (
        IngestResult.SKIPPED,
        "not valid UTF-16-LE despite its byte-order mark (illegal UTF-16 surrogate at byte offset 6)")


def test_content_over_the_size_limit_is_skipped_without_being_read(counter: TokenCounter) -> None:
    small = Settings(shards=2, limits={"max_file_bytes": 1000})
    outcome, cas = _ingest(b"x" * 1001, counter, settings=small)
    assert (outcome.result, outcome.reason) == (IngestResult.SKIPPED, "too large: 1,001 bytes > limit 1,000")
    assert cas.reads == 0
    at_limit, _ = _ingest(b"word " * 200, counter, settings=small)
    assert at_limit.result is IngestResult.PREPARED


def test_the_default_limit_skips_one_byte_over_ten_mebibytes(counter: TokenCounter) -> None:
    outcome, cas = _ingest(b"a" * (LIMIT + 1), counter)
    assert outcome.reason == "too large: 10,485,761 bytes > limit 10,485,760" and cas.reads == 0


def test_missing_content_is_a_permanent_error_naming_the_hash(counter: TokenCounter) -> None:
    cas = InMemoryContentStore()
    event = WriteEvent(op=Op.WRITE, zone="z", path="a.txt", content_hash="sha256:" + "e" * 64, seq=1)
    with pytest.raises(ContentNotFoundError, match="holds no content sha256:e{64}: put the content"):
        ingest_event(event, settings=SETTINGS, cas=cas, stores=[FakeShard(0), FakeShard(1)], counter=counter)


def test_odd_unicode_text_is_indexed_exactly(counter: TokenCounter) -> None:
    text = ("Right-to-left: \u202eevil.exe\u202c and \u200fשלום\u200f.\n"
            "Combining: cafe\u0301, Z\u0351\u0352\u0353algo, \u0e01\u0e34\u0e4a.\n"
            "Zero-width: a\u200bb\u200dc, emoji \U0001f9d1\u200d\U0001f680, BOM inside \ufeffhere.\n")
    outcome, _ = _ingest(text.encode(), counter, path="docs/\u202eodd\u0301.txt")
    assert outcome.result is IngestResult.PREPARED and outcome.document is not None
    chunks = outcome.document.chunks
    assert "".join(c.text for c in chunks).replace("\n", "") == text.replace("\n", "")
    assert outcome.document.event.path == "docs/\u202eodd\u0301.txt"


def test_a_10000_chunk_document_is_indexed_whole(counter: TokenCounter) -> None:
    """No configured cap limits chunks per document (limits has only max_file_bytes): it is indexed."""
    text = "".join(f"# Section {i}\n\nSection {i} is about topic{i} alone.\n\n" for i in range(10_000))
    outcome, _ = _ingest(text.encode(), counter, path="docs/sections.md")
    assert outcome.result is IngestResult.PREPARED and outcome.document is not None
    chunks = outcome.document.chunks
    assert len(chunks) == 10_000
    assert [c.ordinal for c in chunks] == list(range(10_000))
    assert "topic9999" in chunks[-1].text and chunks[-1].end_line == outcome.document.line_count == 40_000


@pytest.mark.slow
def test_a_single_10_mb_line_is_chunked_within_budget(counter: TokenCounter) -> None:
    # The hashing embedder: the chunk budget alone is under test. With the default local model the document
    # is chunked again under a smaller budget until it fits the model (tests/unit/pipeline/embed/
    # test_model_inputs.py), which makes this one line take ~5x longer and tests nothing more here.
    settings = Settings(shards=2, embedder={"provider": "hashing", "dimensions": 64})
    words = " ".join(f"w{i % 9973}x" for i in range(1_700_000))[:10_000_000]
    outcome, _ = _ingest(words.encode(), counter, path="min/bundle.js", settings=settings)
    assert outcome.result is IngestResult.PREPARED and outcome.document is not None
    chunks = outcome.document.chunks
    assert len(chunks) > 1000 and all(c.token_count <= settings.chunking.max_tokens for c in chunks)
    assert all(c.start_line == c.end_line == 1 for c in chunks)
    assert chunks[-1].end_char == len(words)


def test_a_run_of_whitespace_that_crashes_the_tokenizer_is_a_permanent_error(counter: TokenCounter) -> None:
    """tiktoken panics (a BaseException) on ~1M tabs; the stage turns it into an error about this content."""
    text = "before\n" + "\t" * 1_000_000 + "after\n"
    with pytest.raises(UnprocessableContentError) as info:
        _ingest(text.encode(), counter)
    reason = str(info.value)
    assert reason.startswith("the tokenizer crashed on this content (PanicException")
    assert "its longest run of whitespace is 1,000,001 characters, at character 6" in reason  # "\n" + tabs
    assert "shorten them and publish the file again" in reason
    # The process is fine afterwards: the next document tokenizes.
    assert _ingest(b"an ordinary document", counter)[0].result is IngestResult.PREPARED


def test_ten_megabytes_of_spaces_is_whitespace_not_a_tokenizer_crash(counter: TokenCounter) -> None:
    outcome, _ = _ingest(b" " * 10_000_000, counter)
    assert (outcome.result, outcome.reason) == (IngestResult.SKIPPED, "no text to index (whitespace only)")
