"""Fault: the broker (Redis, append-only file fsync'd every second) is restarted while 2,000 write events
stream in.

How: SIGTERM to redis-server (a graceful shutdown: it writes and fsyncs the AOF, then exits), wait until the
process is gone, keep it down a few seconds, then ``launcher.up(only={"redis"})`` on the same data dir.

What it proves: queued and unacknowledged messages survive the restart (AOF); the worker pools reconnect by
themselves; a publisher whose send is refused while the broker is down keeps the events of that message
and publishes them once it is back (the test flushes again, as a user of the publisher would: the sink
keeps a refused message's events for the next flush, and the test counts the refusals; nothing is sent
twice by the publisher). Afterwards the zone holds exactly what a clean run of the same corpus holds: every
document once, at its published seq, same per-path chunk counts and total, no duplicate ordinal or chunk
id, no dead letter; and search finds every document on both legs (its unique word by keyword, its text by
semantic search). A worker pool that exits instead of reconnecting fails the test (after the counts are
checked, the pool being restarted first as an operator would).

What it catches (each seen here before its fix): Celery/kombu 5.7 prefork pools that died with
``AttributeError("'NoneType' object has no attribute 'hostname'")`` when the broker went away
(``shardfuse.workers.broker.transport.Channel._connparams``); retries that could not be published and were dropped
(``PipelineTask._retry`` requeues); document leases whose release failed during the outage and kept the
documents "held by another worker" for ``lease_s`` (``DocumentLeases.release`` never raises, so every lease
of a message is released; a holder takes its own leftovers back); a BM25 rebuild message lost between the
schedule flag and the send (the maintenance worker re-sends it: ``drain`` here never does).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest

from shardfuse.workers.stack import processes
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
    rebuilds_resent,
    restart,
    snapshot,
    wait_in_flight,
)

PACE_S = 0.1
DOWN_S = 3.0


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with own_stack("redis_restart") as running:
        yield running


@pytest.mark.integration
@pytest.mark.faults
@pytest.mark.timeout(600)
def test_broker_restart_mid_stream_loses_nothing(stack: Stack) -> None:
    corpus: list[Doc] = make_corpus()
    clean, clean_s = publish_clean(stack, "clean", corpus, prefix="clean")
    print(f"\nclean run: {clean.summary()} in {clean_s:.1f} s")

    started = time.monotonic()
    publisher = StreamPublisher(stack, "redis-restart", corpus, prefix="restart", pace_s=PACE_S)
    publisher.start()
    publisher.wait_handed(len(corpus) // 3)
    held = wait_in_flight(stack, "embed")
    pid = stack.state.components["redis"].pid
    os.kill(pid, signal.SIGTERM)
    assert processes.wait_gone(pid, timeout=30), "redis did not exit on SIGTERM"
    at_stop = publisher.handed
    time.sleep(DOWN_S)
    restart_s = restart(stack, {"redis"})

    publisher.join_checked()
    crashed: list[str] = []
    try:
        drain(stack, timeout=150)
    except ComponentDied:
        # A pool that exited instead of reconnecting is a failure of this test (asserted last); it is
        # restarted first, as an operator would, so that the counts still say whether anything was lost.
        crashed = dead_components(stack)
        restart(stack, crashed)
        drain(stack, timeout=150)
    fault: ZoneSnapshot = snapshot(stack.settings, "redis-restart", prefix="restart")
    print(f"\nredis stopped after {at_stop} events with {held} embed message(s) in flight, down {DOWN_S:.0f} s "
          f"+ {restart_s:.1f} s restart; publisher refused {publisher.refused} time(s) and re-flushed; "
          f"pools that exited instead of reconnecting: {crashed or 'none'}; "
          f"BM25 rebuilds re-sent by the maintenance worker: "
          f"{rebuilds_resent(stack)}; "
          f"{fault.summary()} (clean {clean.summary()}); {time.monotonic() - started:.1f} s")
    assert_same_as_clean(fault, clean, seqs=publisher.seqs)
    assert_both_legs(stack, "redis-restart", corpus, prefix="restart")
    assert not crashed, f"{crashed} exited on the broker restart instead of reconnecting (see their logs)"
