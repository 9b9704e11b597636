"""Fault: the events of one path arrive out of order.

How: on the shared session stack (nothing is killed here), events with explicit ``seq`` are published one
per message (``CeleryEventSink`` with ``events_per_message=1``) in an order shuffled with a fixed seed,
several paths at once, so the two ingest processes and the embed batcher see them interleaved and out of
order. Then a few sequences are published step by step, each step applied before the next is sent.

What it proves (the version rule: last writer by ``seq`` wins, deletes leave a tombstone):

- ten writes of a path with seq 1..10, shuffled: the document ends at seq 10 with version 10's content
  hash and text, and only its chunks;
- nine writes and a delete at seq 10, shuffled: the document ends deleted at seq 10, with no chunk;
- write 1, delete 2, write 3, shuffled: the document ends indexed with version 3;
- in order: a delete, then an older write delivered after it: still deleted; a write, a delete, then a
  newer write: indexed again with the newer text (a tombstone does not block a newer write).

And search agrees with the rows: every surviving document's final version is found on both legs (its
version's unique word by the keyword leg, its text by the semantic leg), while the word of every
overwritten or deleted version finds nothing.
"""

from __future__ import annotations

import random
import uuid
import zlib
from dataclasses import dataclass

import psycopg
import pytest
from psycopg import sql

from shardfuse.pipeline.admin.publisher import Publisher
from shardfuse.pipeline.core.sharding import shard_for
from shardfuse.pipeline.storage.cas import LocalContentStore
from shardfuse.workers.publishing import CeleryEventSink
from tests.integration.conftest import Stack
from tests.integration.faults.both_legs import Expected, assert_found_on_both_legs, unique_word
from tests.integration.faults.conftest import drain

SEED = 10
VERSIONS = 10


@dataclass(frozen=True)
class Step:
    path: str
    seq: int
    delete: bool = False

    @property
    def word(self) -> str:
        """A word only this version of this path contains (what the keyword leg searches for)."""
        return unique_word(zlib.crc32(f"{self.path}@{self.seq}".encode()))

    @property
    def text(self) -> bytes:
        return f"{self.path} version {self.seq}: the ordering quetzal says {self.seq * 7919}, {self.word}.".encode()

    @property
    def found(self) -> Expected:
        return Expected(path=self.path, word=self.word)


def _publish(stack: Stack, zone: str, steps: list[Step]) -> dict[tuple[str, int], str]:
    """Publish ``steps`` in the given order, one event per message; content hash by (path, seq)."""
    hashes: dict[tuple[str, int], str] = {}
    with CeleryEventSink.connect(stack.settings, events_per_message=1) as sink:
        publisher = Publisher(cas=LocalContentStore(stack.settings.cas_root), sink=sink)
        for step in steps:
            if step.delete:
                publisher.delete(zone=zone, path=step.path, seq=step.seq)
            else:
                event = publisher.write(zone=zone, path=step.path, data=step.text, seq=step.seq)
                assert event.content_hash is not None
                hashes[(step.path, step.seq)] = event.content_hash
    return hashes


def _stored(stack: Stack, zone: str, path: str) -> tuple[tuple[int, str, str | None] | None, list[tuple[int, str]]]:
    """The document row (seq, status, content_hash) and its chunks (seq, text) in ordinal order."""
    shard = shard_for(zone, path, stack.settings.shards)
    schema = sql.Identifier(f"shard_{shard}")
    with psycopg.connect(stack.settings.shard_dsn(shard), connect_timeout=10) as conn:
        row = conn.execute(sql.SQL("SELECT seq, status, content_hash FROM {}.documents WHERE zone = %s AND path = %s")
                           .format(schema), (zone, path)).fetchone()
        chunks = conn.execute(sql.SQL("SELECT seq, text FROM {}.chunks WHERE zone = %s AND path = %s ORDER BY ordinal")
                              .format(schema), (zone, path)).fetchall()
    document = None if row is None else (int(row[0]), str(row[1]), row[2])
    return document, [(int(seq), str(text)) for seq, text in chunks]


def _assert_indexed_at(stack: Stack, zone: str, path: str, seq: int, hashes: dict[tuple[str, int], str]) -> None:
    document, chunks = _stored(stack, zone, path)
    assert document == (seq, "indexed", hashes[(path, seq)]), (path, document)
    assert chunks and all(chunk_seq == seq for chunk_seq, _ in chunks), (path, chunks)
    assert "".join(text for _, text in chunks).strip() == Step(path, seq).text.decode(), (path, chunks)


def _assert_deleted_at(stack: Stack, zone: str, path: str, seq: int) -> None:
    document, chunks = _stored(stack, zone, path)
    assert document is not None and document[:2] == (seq, "deleted"), (path, document)
    assert chunks == [], (path, chunks)


@pytest.mark.integration
@pytest.mark.faults
@pytest.mark.timeout(180)
def test_shuffled_versions_of_several_paths_end_at_the_highest_seq(stack: Stack) -> None:
    zone = f"seq-order-{uuid.uuid4().hex[:8]}"
    latest = [f"latest-{k}.txt" for k in range(6)]
    deleted = [f"deleted-{k}.txt" for k in range(3)]
    revived = [f"revived-{k}.txt" for k in range(3)]
    steps = [Step(path, seq) for path in latest for seq in range(1, VERSIONS + 1)]
    steps += [Step(path, seq) for path in deleted for seq in range(1, VERSIONS)]
    steps += [Step(path, VERSIONS, delete=True) for path in deleted]
    steps += [s for path in revived for s in (Step(path, 1), Step(path, 2, delete=True), Step(path, 3))]
    random.Random(SEED).shuffle(steps)

    hashes = _publish(stack, zone, steps)
    drain(stack, timeout=120)

    for path in latest:
        _assert_indexed_at(stack, zone, path, VERSIONS, hashes)
    for path in deleted:
        _assert_deleted_at(stack, zone, path, VERSIONS)
    for path in revived:
        _assert_indexed_at(stack, zone, path, 3, hashes)
    final = [Step(path, VERSIONS) for path in latest] + [Step(path, 3) for path in revived]
    gone = [step.word for step in steps if step not in final]
    assert len({step.word for step in steps}) == len(steps)  # every version's word is its own
    assert_found_on_both_legs(stack.settings, zone, [step.found for step in final], absent=gone)


@pytest.mark.integration
@pytest.mark.faults
@pytest.mark.timeout(180)
def test_a_tombstone_refuses_an_older_write_and_yields_to_a_newer_one(stack: Stack) -> None:
    zone = f"seq-tombstone-{uuid.uuid4().hex[:8]}"
    hashes: dict[tuple[str, int], str] = {}
    # Each step is applied before the next is sent: the order of arrival is exactly the order below.
    for step in (Step("kept-dead.txt", 5), Step("kept-dead.txt", 20, delete=True), Step("kept-dead.txt", 15),
                 Step("back.txt", 1), Step("back.txt", 2, delete=True), Step("back.txt", 3)):
        hashes |= _publish(stack, zone, [step])
        drain(stack, timeout=60)
        if step.path == "back.txt" and step.seq == 2:
            _assert_deleted_at(stack, zone, "back.txt", 2)
    _assert_deleted_at(stack, zone, "kept-dead.txt", 20)
    _assert_indexed_at(stack, zone, "back.txt", 3, hashes)
    gone = [Step(path, seq).word for path, seq in (("kept-dead.txt", 5), ("kept-dead.txt", 15), ("back.txt", 1))]
    assert_found_on_both_legs(stack.settings, zone, [Step("back.txt", 3).found], absent=gone)
