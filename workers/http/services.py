"""What one API process holds while it serves: its settings, the keys, the rate limiter, the CAS, and the RPC
clients its searches go through. Built when the server starts (the app's lifespan), never at import."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import redis

from shardfuse.pipeline.admin.api_keys import KeyRing, key_ring
from shardfuse.pipeline.admin.publisher import EventSink
from shardfuse.pipeline.config.redaction import redact_dsn
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.coordination.redis_errors import redis_errors
from shardfuse.pipeline.coordination.token_bucket import TokenBucket
from shardfuse.pipeline.core.errors import StoreUnavailableError
from shardfuse.pipeline.storage.cas import ContentStore
from shardfuse.pipeline.storage.opening import open_content_store
from shardfuse.workers.client import SearchClient
from shardfuse.workers.monitor import broker_client
from shardfuse.workers.publishing import CeleryEventSink

# A hash nothing is stored under: looking it up answers "no" from a CAS that is there, and fails from one that is not.
_PROBE_HASH = "sha256:" + "0" * 64
READY_TIMEOUT_S = 3


class SearchClients:
    """At most ``size`` searches at once, each on an RPC client of its own: Celery's Redis result backend reads
    its pub/sub connection unlocked, so two threads must never wait on one client's results together."""

    def __init__(self, settings: Settings, *, size: int) -> None:
        self._settings = settings
        self._slots = threading.BoundedSemaphore(size)
        self._free: queue.LifoQueue[SearchClient] = queue.LifoQueue()

    def search(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The ``shardfuse.search`` task's answer to ``arguments`` (blocking: call it from a worker thread)."""
        with self._slots:
            try:
                client = self._free.get_nowait()
            except queue.Empty:
                client = SearchClient(self._settings)
            try:
                return client.search(**arguments)
            finally:
                self._free.put(client)


@dataclass
class Services:
    settings: Settings
    keys: KeyRing
    searches: SearchClients
    cas: ContentStore
    broker: redis.Redis
    limiter: TokenBucket | None  # None: api.rate_per_s is 0

    @classmethod
    def build(cls, settings: Settings) -> Services:
        broker = broker_client(settings)
        api = settings.api
        limiter = (TokenBucket(broker, name="api", rate_per_s=api.rate_per_s, burst=api.burst)
                   if api.rate_per_s > 0 else None)
        return cls(settings=settings, keys=key_ring(settings),
                   searches=SearchClients(settings, size=api.search_concurrency),
                   cas=open_content_store(settings), broker=broker, limiter=limiter)

    @property
    def max_upload_bytes(self) -> int:
        return self.settings.api.max_upload_bytes or self.settings.limits.max_file_bytes

    @contextlib.contextmanager
    def event_sink(self) -> Iterator[EventSink]:
        """A sink publishing on the broker; what was sent is published when the block ends."""
        with CeleryEventSink.connect(self.settings, events_per_message=1) as sink:
            yield sink

    def readiness(self) -> dict[str, str]:
        """Each store's answer: ``"ok"`` or why not (blocking)."""
        checks: dict[str, Callable[[], None]] = {"broker": self._broker_ready, "postgres": self._postgres_ready,
                                                 "cas": self._cas_ready}
        answers = {}
        for name, check in checks.items():
            try:
                check()
                answers[name] = "ok"
            except StoreUnavailableError as exc:
                answers[name] = str(exc)
        return answers

    def _broker_ready(self) -> None:
        with redis_errors(self.broker, "the broker"):
            self.broker.ping()

    def _postgres_ready(self) -> None:
        dsns = dict.fromkeys([self.settings.postgres.dsn, *self.settings.postgres.shard_dsns])
        for dsn in dsns:
            try:
                with psycopg.connect(dsn, connect_timeout=READY_TIMEOUT_S) as conn:
                    conn.execute("SELECT 1")
            except psycopg.Error as exc:
                raise StoreUnavailableError(f"PostgreSQL at {redact_dsn(dsn)} does not answer: {exc}") from exc

    def _cas_ready(self) -> None:
        self.cas.exists(_PROBE_HASH)

    def close(self) -> None:
        self.broker.close()
