"""Fault: the broker's Redis loses everything (``FLUSHALL``) while 2,000 write events stream in, and
``shardfuse reconcile`` repairs what was lost.

How: the corpus is written to a folder first (``<tmp>/flush/docs/NNNN.txt``), so that its files and the
published documents share their names (``flush/docs/NNNN.txt``: ``publish`` and ``reconcile`` name files
relative to the working directory). A third of the way into the stream, with embed work in flight, one
``FLUSHALL`` wipes the broker's Redis: queued and unacknowledged messages, document leases, liveness keys,
the BM25 freshness counters, the caches and the result backend. The stream goes on to its end, the pipeline
drains, then ``shardfuse reconcile flush --zone redis-flush`` runs from that folder, and the pipeline drains
again.

What it proves: the worker pools survive the wipe (no pool exits); what was never lost is indexed once;
reconcile publishes exactly the documents the wipe lost (one write per document missing from every shard,
no delete, nothing else); afterwards the zone holds exactly what a clean run of the same corpus holds (every
document once, at its seq: the stream's, or reconcile's for the repaired ones; same per-path chunk counts, no
duplicate, no dead letter), and BOTH legs find every document: its unique word by keyword search (the BM25
index follows PostgreSQL although its dirty counters were wiped) and its first chunk by semantic search.
A second reconcile finds nothing to do.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardfuse.workers import monitor
from tests.integration.conftest import Stack
from tests.integration.faults.conftest import (
    ComponentDied,
    Doc,
    StreamPublisher,
    ZoneSnapshot,
    assert_both_legs,
    assert_same_as_clean,
    dead_components,
    drain,
    make_corpus,
    own_stack,
    publish_clean,
    restart,
    snapshot,
    wait_in_flight,
)

# No pause between messages: the stream outruns the ingest pool, so that messages wait in the queues when
# the wipe comes (a flush that loses nothing would prove nothing about reconcile).
PACE_S = 0.0
MIN_WAITING = 5
ZONE = "redis-flush"
PREFIX = "flush"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    # The fault stack's ingest soft limit is 20 s: a document's deadline must be shorter.
    with own_stack("redis_flush", {"SHARDFUSE_INGEST__DOCUMENT_DEADLINE_S": "15"}) as running:
        yield running


@pytest.fixture
def corpus_dir() -> Iterator[Path]:
    """A folder holding the corpus as files under ``flush/``: the working directory of ``reconcile``."""
    base = Path(tempfile.mkdtemp(prefix="shardfuse-flush-"))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def write_corpus(base: Path, corpus: list[Doc]) -> None:
    for doc in corpus:
        target = base / PREFIX / doc.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(doc.data)


def reconcile(stack: Stack, cwd: Path) -> dict[str, object]:
    """``shardfuse reconcile flush --zone redis-flush --json`` run from ``cwd``: its JSON report."""
    proc = subprocess.run([sys.executable, "-m", "shardfuse.workers.cli.main", "reconcile", PREFIX, "--zone", ZONE,
                           "--json"], env=stack.env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"reconcile failed ({proc.returncode}):\n{proc.stderr}"
    report: dict[str, object] = json.loads(proc.stdout)
    return report


def wait_queued(stack: Stack, minimum: int, *, timeout: float = 60.0) -> int:
    """Block until at least ``minimum`` messages wait in the queues (safety bound ``timeout``); the count."""
    client = monitor.broker_client(stack.settings)
    deadline = time.monotonic() + timeout
    try:
        while (waiting := sum(monitor.queue_depths(client).values())) < minimum:
            assert time.monotonic() < deadline, f"never {minimum} messages waiting (last {waiting})"
            time.sleep(0.02)
        return waiting
    finally:
        client.close()


def drain_or_restart(stack: Stack, timeout: float) -> list[str]:
    """:func:`drain`; a pool that exited is restarted first, as an operator would, and named (a failure)."""
    try:
        drain(stack, timeout=timeout)
        return []
    except ComponentDied:
        crashed = dead_components(stack)
        restart(stack, crashed)
        drain(stack, timeout=timeout)
        return crashed


@pytest.mark.integration
@pytest.mark.faults
@pytest.mark.timeout(900)
def test_broker_flushed_mid_stream_is_repaired_by_reconcile(stack: Stack, corpus_dir: Path) -> None:
    corpus = make_corpus()
    write_corpus(corpus_dir, corpus)
    clean, clean_s = publish_clean(stack, "clean", corpus, prefix="clean")
    print(f"\nclean run: {clean.summary()} in {clean_s:.1f} s")

    started = time.monotonic()
    publisher = StreamPublisher(stack, ZONE, corpus, prefix=PREFIX, pace_s=PACE_S)
    publisher.start()
    publisher.wait_handed(len(corpus) // 3)
    held = wait_in_flight(stack, "embed")
    wait_queued(stack, MIN_WAITING)
    client = monitor.broker_client(stack.settings)
    try:
        waiting = monitor.queue_depths(client)
        in_flight = sum(monitor.unacked_by_queue(client).values())
        client.flushall()
    finally:
        client.close()
    at_flush = publisher.handed

    publisher.join_checked()
    crashed = drain_or_restart(stack, timeout=200)
    before: ZoneSnapshot = snapshot(stack.settings, ZONE, prefix=PREFIX)
    lost = sorted(f"{PREFIX}/{doc.name}" for doc in corpus if doc.name not in before.documents)
    assert lost, f"the flush lost nothing ({waiting} waiting): nothing for reconcile to repair"

    repaired = reconcile(stack, corpus_dir)
    crashed += drain_or_restart(stack, timeout=200)
    events = repaired["events"]
    assert isinstance(events, list)
    fault = snapshot(stack.settings, ZONE, prefix=PREFIX)
    print(f"\nFLUSHALL after {at_flush} events handed, {sum(waiting.values())} message(s) waiting {waiting}, "
          f"{in_flight} unacknowledged ({held} embed); {len(lost)} document(s) lost; reconcile: "
          f"{repaired['walked']} files walked, {repaired['compared']} documents compared, {len(events)} event(s) "
          f"published in {repaired['messages']} message(s); pools that exited: {crashed or 'none'}; "
          f"{fault.summary()} (clean {clean.summary()}); {time.monotonic() - started:.1f} s")
    # Exactly the difference: one write per lost document, nothing else.
    assert (repaired["write"], repaired["delete"]) == (lost, [])
    assert sorted((e["op"], e["path"]) for e in events) == [("write", path) for path in lost]
    assert (repaired["walked"], repaired["unchanged"]) == (len(corpus), len(corpus) - len(lost))
    seqs = {**publisher.seqs, **{str(e["path"]).removeprefix(f"{PREFIX}/"): int(e["seq"]) for e in events}}
    assert_same_as_clean(fault, clean, seqs=seqs)
    assert_both_legs(stack, ZONE, corpus, prefix=PREFIX)
    again = reconcile(stack, corpus_dir)
    assert (again["write"], again["delete"], again["events"]) == ([], [], [])
    assert not crashed, f"{crashed} exited on the flush instead of carrying on (see their logs)"
