"""A worker process's life cycle, wired to Celery's signals: warm the runtime up before the first task,
watch deliveries (claim what this worker holds, release what dead workers held), and close everything on
shutdown. The resources themselves are in :mod:`shardfuse.workers.runtime`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import redis
from celery import Celery, signals
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.utils.dispatch import Signal

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.index.store.lag_reader import ShardLagReader
from shardfuse.workers import monitor
from shardfuse.workers.broker.redelivery import DeliveryWatch
from shardfuse.workers.names import Queue
from shardfuse.workers.names import Task as TaskName
from shardfuse.workers.own_worker import OwnWorker
from shardfuse.workers.runtime import RuntimeHolder

log = logging.getLogger(__name__)
# The interpreter's switch interval in worker processes (Python's default is 5 ms).
SWITCH_INTERVAL_S = 0.0005


def _consumed_queues(app: Celery) -> list[str]:
    return sorted(app.amqp.queues.consume_from or app.amqp.queues)


def connect_signals(app: Celery) -> None:
    """Connect this worker app's life cycle (:class:`_LifeCycle`) to Celery's signals; once per process."""
    life = _LifeCycle(app)
    receivers: list[tuple[Signal, Callable[..., None]]] = [
        (signals.worker_process_init, life.child_started),
        (signals.worker_init, life.worker_starting),
        (signals.worker_ready, life.worker_ready),
        (signals.worker_process_shutdown, life.stopping),
        (signals.worker_shutdown, life.stopping),
    ]
    for signal, receiver in receivers:
        signal.connect(receiver, weak=False)


class _LifeCycle:
    """The receivers of one worker app's signals: only this app's worker starts this app's runtime and delivery
    watch, or closes them (:mod:`shardfuse.workers.own_worker`)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.holder: RuntimeHolder = app.shardfuse_runtime
        self.own = OwnWorker(app)
        # The delivery watch and what it alone uses (its Redis client, the rebuild watchdog's PostgreSQL
        # connections), closed together after it stops.
        self.watch: list[tuple[DeliveryWatch, ExitStack]] = []

    def child_started(self, **_: Any) -> None:
        if self.own.runs_here:
            self.holder.get().start_warm_up(_consumed_queues(self.app))

    def worker_starting(self, sender: Any = None, **_: Any) -> None:
        if not self.own.mark_if_ours(sender):
            return
        # A thread pool's consumer loop is I/O-bound: after each socket read it needs the GIL back, and with
        # the default 5 ms switch interval a busy task thread keeps it that long every time. Hand it over
        # sooner.
        sys.setswitchinterval(SWITCH_INTERVAL_S)

    def worker_ready(self, sender: Any = None, **_: Any) -> None:
        if not self.own.sent_by_ours(sender):
            return
        # Workers start in any order with their stores. First the watch: the process that talks to the
        # broker says it is alive, claims what it holds and releases what dead workers held, whether or not
        # PostgreSQL answers yet (and, if Redis does not, from the first interval it does).
        self._start_watch()
        # Then the warm-up, retried in the background while a store does not answer. Prefork children warm up in
        # worker_process_init; thread and solo pools run tasks in this process.
        if not isinstance(getattr(sender, "pool", None), PreforkPool):
            self.holder.get().start_warm_up(_consumed_queues(self.app))

    def _start_watch(self) -> None:
        settings = self.holder.settings
        with ExitStack() as opened:  # closed here if the watch cannot be set up, else when it stops
            client = opened.enter_context(redis.Redis.from_url(settings.broker.url))
            delivery_watch = DeliveryWatch(client, interval_s=settings.delivery.heartbeat_s,
                                           dead_after_s=settings.delivery.dead_after_s, restore=_restorer(self.app))
            if Queue.MAINTENANCE.value in _consumed_queues(self.app):
                lags = opened.enter_context(ShardLagReader(settings))
                delivery_watch.heartbeat.on_beat(_rebuild_watchdog(self.app, settings, client, lags))
            delivery_watch.start()
            self.watch.append((delivery_watch, opened.pop_all()))

    def stopping(self, sender: Any = None, **_: Any) -> None:
        if not self.own.stopping(sender):
            return
        # A prefork child forked after worker_ready inherits the list: only the process that started the
        # watch may stop it (stopping deletes its liveness and claims).
        while self.watch and self.watch[-1][0].pid == os.getpid():
            stopped, resources = self.watch.pop()
            stopped.stop()  # joins the heartbeat: no beat uses the resources after this
            resources.close()
        self.holder.close()


def _rebuild_watchdog(app: Celery, settings: Settings, client: redis.Redis,
                      lags: ShardLagReader) -> Callable[[], None]:
    """A maintenance worker's beat: send the rebuild of a shard left behind with no maintenance work
    anywhere (:class:`shardfuse.workers.monitor.LostRebuilds`: its message was lost while the broker was down), so
    it is searchable by keyword again without waiting for the next write to it or a ``shardfuse wait``."""
    lost = monitor.LostRebuilds(settings)
    # ``lags`` keeps one connection for every beat (it connects again after an error): a new one at each beat
    # cost PostgreSQL a backend and a password exchange every few seconds for the worker's whole life.

    def check() -> None:
        # unacked holds whole messages: read it (pending_work) only when some shard is behind.
        state = (monitor.pending_work(settings, client, lags=lags) if monitor.stale_shards(settings, client, lags=lags)
                 else {"stale_shards": [], "pending": {}})
        for shard in lost.due(state, time.monotonic()):
            log.warning("shard %d's BM25 index is behind and no rebuild is queued: sending one", shard)
            app.send_task(TaskName.BM25_REBUILD.value, kwargs={"shard": shard})

    return check


def _restorer(app: Celery) -> Callable[[str], None]:
    """Put an unacked message back on its queue by delivery tag, through kombu's own transaction."""
    connection: list[Any] = []
    lock = threading.Lock()

    def restore(tag: str) -> None:
        with lock:
            if not connection:
                connection.append(app.connection_for_write())
            try:
                connection[0].default_channel.qos.restore_by_tag(tag)
            except Exception:
                connection.pop().release()  # a fresh connection next time
                raise

    return restore
