"""Fault: PostgreSQL is stopped for 10 s while 2,000 write events stream in, then started again.

How: ``pg_ctl stop -m fast`` (what ``shardfuse down`` does: open transactions roll back, the server
checkpoints and exits), 10 s with no database, then ``launcher.up(only={"postgres"})`` on the same data
directory.

What it proves:

- ``test_postgres_outage_mid_stream_loses_nothing``: every task that met the outage (early version check,
  embedding cache, shard transaction) failed as a retryable ``StoreUnavailableError``, was retried with
  backoff and completed once the server was back; worker pools recover their connection pools by
  themselves. The zone then holds exactly what a clean run holds (every document once at its published
  seq, same per-path chunk counts and total, no duplicate, no dead letter), and search finds every
  document on both legs (its unique word by keyword, its text by semantic search).
- ``test_dead_letter_recorded_during_an_outage_is_not_lost``: an event that must be dead-lettered (its
  content hash is malformed: a permanent error, dead-lettered at once) arriving while PostgreSQL is down
  ends up recorded exactly once after the server is back, rather than being acknowledged with its failure
  recorded nowhere.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from shardfuse.pipeline.index.store.schema import SHARED_SCHEMA
from shardfuse.workers import monitor
from shardfuse.workers.app import create_app
from shardfuse.workers.names import Task
from shardfuse.workers.stack import postgres_server
from shardfuse.workers.stack.layout import StackLayout
from tests.integration.conftest import Stack
from tests.integration.faults.conftest import (
    Doc,
    StreamPublisher,
    assert_both_legs,
    assert_same_as_clean,
    drain,
    make_corpus,
    own_stack,
    publish_clean,
    rebuilds_resent,
    restart,
    snapshot,
    wait_in_flight,
)

PACE_S = 0.1
DOWN_S = 10.0
DLQ_ZONE = "pg-down-dlq"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with own_stack("postgres_stop") as running:
        yield running


def _stop_postgres(stack: Stack) -> float:
    started = time.monotonic()
    pid = stack.state.components["postgres"].pid
    postgres_server.stop_postgres(StackLayout(stack.settings.data_path), pid=pid, timeout=30)
    return time.monotonic() - started


def _taken_within(stack: Stack, queue: str, seconds: float) -> bool:
    """Whether a worker was seen holding a ``queue`` message within ``seconds`` (an observation, not a check:
    a message acknowledged at once can slip between two looks)."""
    client = monitor.broker_client(stack.settings)
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if monitor.unacked_by_queue(client)[queue]:
                return True
            time.sleep(0.02)
        return False
    finally:
        client.close()


def _dead_letters(stack: Stack, zone: str) -> list[tuple[str, int]]:
    with psycopg.connect(stack.settings.postgres.dsn, connect_timeout=10) as conn:
        rows = conn.execute(f"SELECT error_class, attempts FROM {SHARED_SCHEMA}.deadletters WHERE zone = %s",
                            (zone,)).fetchall()
    return [(str(error), int(attempts)) for error, attempts in rows]


@pytest.mark.integration
@pytest.mark.faults
@pytest.mark.timeout(600)
def test_postgres_outage_mid_stream_loses_nothing(stack: Stack) -> None:
    corpus: list[Doc] = make_corpus()
    clean, clean_s = publish_clean(stack, "clean", corpus, prefix="clean")
    print(f"\nclean run: {clean.summary()} in {clean_s:.1f} s")

    started = time.monotonic()
    publisher = StreamPublisher(stack, "pg-stop", corpus, prefix="pgstop", pace_s=PACE_S)
    publisher.start()
    publisher.wait_handed(len(corpus) // 3)
    held = wait_in_flight(stack, "embed")
    stop_s = _stop_postgres(stack)
    at_stop = publisher.handed
    time.sleep(DOWN_S)
    restart_s = restart(stack, {"postgres"})

    publisher.join_checked()
    drain(stack)
    fault = snapshot(stack.settings, "pg-stop", prefix="pgstop")
    print(f"\npostgres stopped ({stop_s:.1f} s) after {at_stop} events with {held} embed message(s) in flight, "
          f"down {DOWN_S:.0f} s + {restart_s:.1f} s restart; BM25 rebuilds re-sent by the maintenance worker: "
          f"{rebuilds_resent(stack)}; "
          f"{fault.summary()} (clean {clean.summary()}); "
          f"{time.monotonic() - started:.1f} s")
    assert_same_as_clean(fault, clean, seqs=publisher.seqs)
    assert_both_legs(stack, "pg-stop", corpus, prefix="pgstop")


@pytest.mark.integration
@pytest.mark.faults
@pytest.mark.timeout(300)
def test_dead_letter_recorded_during_an_outage_is_not_lost(stack: Stack) -> None:
    app = create_app(stack.settings)
    bad = {"op": "write", "zone": DLQ_ZONE, "path": "bad-hash.txt", "content_hash": "sha256:nothex", "seq": 1}
    _stop_postgres(stack)
    try:
        app.send_task(Task.INGEST.value, kwargs={"event": bad})
        taken = _taken_within(stack, "ingest", DOWN_S)  # a worker has it: it dead-letters with no database
        time.sleep(DOWN_S)
    finally:
        restart(stack, {"postgres"})
        app.close()
    drain(stack)
    recorded = _dead_letters(stack, DLQ_ZONE)
    print(f"\nevent taken by a worker while postgres was down: {taken}; dead letters recorded for it: {recorded}")
    assert len(recorded) == 1 and recorded[0][0].endswith("InvalidEventError"), recorded
