"""Which worker processes are alive: each says so in Redis every few seconds, under a key that expires.

A process's *holder id* names one incarnation of it (host, pid and a random suffix, so a restarted worker
that reuses a pid or a node name is a new holder). Document leases (:mod:`shardfuse.pipeline.coordination.leases`)
and the delivery reaper (``shardfuse.workers.broker.redelivery``) check these keys instead of trusting timeouts
alone: work held by a process that stopped beating is released within ``dead_after_s``, not after the task's
time limit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable

import redis

from shardfuse.pipeline.coordination.redis_errors import redis_errors
from shardfuse.pipeline.core.errors import TransientError

log = logging.getLogger(__name__)

ALIVE_PREFIX = "shardfuse:alive:"


def alive_key(holder: str) -> str:
    return ALIVE_PREFIX + holder


def new_holder_id(role: str = "") -> str:
    """An id for this incarnation of this process: ``host:pid:suffix`` (``role`` names what it does)."""
    name = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
    return f"{role}@{name}" if role else name


class Heartbeat:
    """A daemon thread that keeps ``shardfuse:alive:<holder>`` set (expiring after ``dead_after_s``) and
    runs ``on_beat`` callbacks after each beat (the delivery reaper hangs off the main process's one).

    A beat that fails (Redis restarting) is logged and retried at the next interval; the holder counts as
    dead to others meanwhile only if the outage outlasts ``dead_after_s``.
    """

    def __init__(self, client: redis.Redis, *, holder: str, interval_s: float, dead_after_s: float) -> None:
        if dead_after_s <= interval_s:
            raise ValueError("dead_after_s must exceed the heartbeat interval")
        self.client = client
        self.holder = holder
        self.interval_s = interval_s
        self.dead_after_s = dead_after_s
        self._callbacks: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def on_beat(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def beat(self) -> None:
        """Say this holder is alive; :class:`~shardfuse.pipeline.core.errors.StoreUnavailableError` when Redis
        is out of reach."""
        with redis_errors(self.client, f"the heartbeat of {self.holder}"):
            self.client.set(alive_key(self.holder), os.getpid(), px=int(self.dead_after_s * 1000))

    def start(self) -> Heartbeat:
        with self._lock:
            if self._thread is None:
                self.beat()  # alive before the first lease is taken
                self._thread = threading.Thread(target=self._run, name="shardfuse-heartbeat", daemon=True)
                self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 1)
        with contextlib.suppress(redis.RedisError):  # otherwise it expires on its own
            self.client.delete(alive_key(self.holder))

    close = stop

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except TransientError as exc:
                log.warning("%s (will retry)", exc)
                continue
            for callback in self._callbacks:
                try:
                    callback()
                except Exception:  # noqa: BLE001 - a failing callback must not stop the heartbeat
                    log.warning("heartbeat callback of %s failed", self.holder, exc_info=True)
