"""Counters and histograms added up across every process of a deployment, in Redis.

A worker process counts what it does (events published, indexed, dead-lettered, chunks embedded, provider
429s, query latencies) with :func:`inc` and :func:`observe`: a lock and a dict addition, no I/O on the
caller's thread. A daemon thread of each process adds what was counted since its last flush to a few
Redis hashes (``shardfuse:metrics:*``) every :data:`FLUSH_INTERVAL_S`, in one ``MULTI`` of
``HINCRBYFLOAT``/``HINCRBY``, and once more when the process stops; every process of every host adds to the
same totals, which ``shardfuse exporter`` and ``shardfuse status`` read
(:mod:`shardfuse.pipeline.observability.metric_totals`).

A flush that cannot reach Redis keeps its increments for the next one (logged once per outage), so an
outage delays counts and loses none, except those of a process killed before Redis came back. (Were the
connection to break after Redis applied a ``MULTI`` but before its reply arrived, the next flush would add
those increments again: counts are at least once, not exactly once.)

Histograms have fixed buckets: an observation adds 1 to the one bucket it falls in (the totals hold
per-bucket counts, made cumulative when read), and its value to the series' sum.

Fork safety: a forked child (a Celery prefork pool process) starts with nothing counted (its parent flushes
what it had counted itself) and starts a flusher of its own at its first count.

Nothing here knows about Celery; each entry point calls :func:`connect_redis` with its broker URL.
"""

from __future__ import annotations

import atexit
import bisect
import json
import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import redis

log = logging.getLogger(__name__)

PREFIX = "shardfuse:metrics"
COUNTERS_KEY = f"{PREFIX}:counters"  # field: [name, labels] → total
BUCKETS_KEY = f"{PREFIX}:buckets"  # field: [name, labels, upper bound] → observations in that bucket alone
SUMS_KEY = f"{PREFIX}:sums"  # field: [name, labels] → sum of the observed values
FLUSH_INTERVAL_S = 2.0
# Upper bounds, in seconds, of every histogram's buckets (above the last: +Inf).
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)
INF = "+Inf"
# Socket timeouts of the flusher's Redis client: a flush never waits long on a Redis that is away.
_REDIS_TIMEOUT_S = 2.0

# What is counted, and its labels (the exporter adds ``shardfuse_`` and, for counters, ``_total``).
EVENTS_PUBLISHED = "events_published"  # op: write | delete
EVENTS = "events"  # stage: ingest | embed | maintenance; outcome: see workers/tasks
EMBEDDING_CHUNKS = "embedding_chunks"  # provider, model: chunks handed to the embedding stage
EMBEDDING_CACHE_HITS = "embedding_cache_hits"  # provider, model: distinct texts the cache answered
EMBEDDING_CACHE_MISSES = "embedding_cache_misses"  # provider, model: distinct texts it did not
EMBEDDING_TEXTS = "embedding_texts_embedded"  # provider, model: texts the provider embedded
EMBEDDING_TOKENS = "embedding_tokens"  # provider, model: tokens sent
EMBEDDING_REQUESTS = "embedding_requests"  # provider, model, outcome: ok | failed (after retries)
PROVIDER_RATE_LIMITED = "provider_rate_limited"  # provider: 429 answers
PROVIDER_RETRIES = "provider_retries"  # provider: attempts retried after a transient failure
QUERY_DURATION = "query_duration_seconds"  # mode, outcome: ok | cached | invalid | error (histogram)

HELP: dict[str, str] = {
    EVENTS_PUBLISHED: "Write and delete events published to the ingest queue.",
    EVENTS: "Work items settled by each pipeline stage (ingest: events, embed: documents, maintenance: "
            "messages), by outcome.",
    EMBEDDING_CHUNKS: "Chunks handed to the embedding stage (cache hits included).",
    EMBEDDING_CACHE_HITS: "Distinct chunk texts the embedding cache answered.",
    EMBEDDING_CACHE_MISSES: "Distinct chunk texts the embedding cache did not hold.",
    EMBEDDING_TEXTS: "Chunk texts the embedding provider embedded.",
    EMBEDDING_TOKENS: "Tokens sent to the embedding provider.",
    EMBEDDING_REQUESTS: "Embedding provider requests, by final outcome (after retries).",
    PROVIDER_RATE_LIMITED: "Provider answers that were HTTP 429 (rate limited).",
    PROVIDER_RETRIES: "Provider calls retried after a transient failure (429, 5xx, timeout, reset).",
    QUERY_DURATION: "Time the search task took, by mode and outcome.",
}

Labels = tuple[tuple[str, str], ...]
Series = tuple[str, Labels]


def labels_of(labels: Mapping[str, object]) -> Labels:
    """Labels in a canonical order, values as text."""
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


def series_field(name: str, labels: Labels) -> str:
    """The hash field of a series (JSON: unambiguous whatever the label values hold)."""
    return json.dumps([name, [list(pair) for pair in labels]], separators=(",", ":"))


def bucket_field(name: str, labels: Labels, upper: str) -> str:
    return json.dumps([name, [list(pair) for pair in labels], upper], separators=(",", ":"))


def bound_text(bound: float) -> str:
    return repr(float(bound))


class MetricsRecorder:
    """Counts in memory and flushes to Redis on a thread of its own (started at the first count after
    :meth:`connect`). Thread-safe; fork-safe (see the module docstring)."""

    def __init__(self, *, flush_interval_s: float = FLUSH_INTERVAL_S, buckets: tuple[float, ...] = BUCKETS_S) -> None:
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"histogram buckets must be distinct and ascending, got {buckets}")
        self._interval_s = flush_interval_s
        self._bounds = buckets
        self._bound_texts = tuple(bound_text(b) for b in buckets) + (INF,)
        self._client_factory: Callable[[], Any] | None = None
        self._reset()
        self._exit_registered = False
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _call(ref, "_after_fork_in_child"))

    def _reset(self) -> None:
        self._lock = threading.Lock()  # guards the pending counts below
        self._flush_lock = threading.Lock()  # one flush at a time
        self._counters: dict[Series, float] = {}
        self._buckets: dict[tuple[Series, str], int] = {}
        self._sums: dict[Series, float] = {}
        self._client: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._failing = False

    # -- recording (any thread; no I/O) -------------------------------------------------------------------
    def inc(self, name: str, value: float = 1, **labels: object) -> None:
        """Add ``value`` to the counter ``name`` of these labels."""
        series = (name, labels_of(labels))
        with self._lock:
            self._counters[series] = self._counters.get(series, 0) + value
        self._ensure_flusher()

    def observe(self, name: str, value: float, **labels: object) -> None:
        """Record one observation (seconds) in the histogram ``name`` of these labels."""
        series = (name, labels_of(labels))
        key = (series, self._bound_texts[bisect.bisect_left(self._bounds, value)])
        with self._lock:
            self._buckets[key] = self._buckets.get(key, 0) + 1
            self._sums[series] = self._sums.get(series, 0.0) + value
        self._ensure_flusher()

    def pending(self) -> dict[str, Any]:
        """What is counted and not yet flushed (for tests and logs)."""
        with self._lock:
            return {"counters": dict(self._counters), "buckets": dict(self._buckets), "sums": dict(self._sums)}

    # -- flushing ------------------------------------------------------------------------------------------
    def connect(self, client_factory: Callable[[], Any]) -> None:
        """Flush to the Redis ``client_factory()`` returns (called on the flusher's first use, and again in
        a forked child). What is pending then goes there too."""
        with self._lock:
            self._client_factory = client_factory
            self._client = None
            if not self._exit_registered:
                atexit.register(self.close)
                self._exit_registered = True

    def _ensure_flusher(self) -> None:
        if self._thread is not None or self._client_factory is None:
            return
        with self._lock:
            if self._thread is None:
                self._stop = threading.Event()
                thread = threading.Thread(target=self._run, name="metrics-flush", daemon=True)
                try:
                    thread.start()
                except RuntimeError:  # the interpreter is shutting down: the exit flush sends what is left
                    return
                self._thread = thread

    def _run(self) -> None:
        stop = self._stop
        while not stop.wait(self._interval_s):
            self.flush()

    def flush(self) -> bool:
        """Add what was counted since the last flush to the Redis totals; False (and nothing lost) when
        Redis cannot be reached. Never raises."""
        with self._flush_lock:
            with self._lock:
                counters, buckets, sums = self._counters, self._buckets, self._sums
                self._counters, self._buckets, self._sums = {}, {}, {}
                factory = self._client_factory
            if not (counters or buckets or sums):
                return True
            if factory is None:
                self._merge(counters, buckets, sums)
                return False
            try:
                client = self._client
                if client is None:
                    client = self._client = factory()
                pipe = client.pipeline(transaction=True)
                for (name, labels), value in counters.items():
                    pipe.hincrbyfloat(COUNTERS_KEY, series_field(name, labels), value)
                for ((name, labels), upper), count in buckets.items():
                    pipe.hincrby(BUCKETS_KEY, bucket_field(name, labels, upper), count)
                for (name, labels), total in sums.items():
                    pipe.hincrbyfloat(SUMS_KEY, series_field(name, labels), total)
                pipe.execute()
            except redis.ResponseError as exc:
                # Redis refused the commands themselves (a key of another type under our names): sending them
                # again can never succeed, and some of the MULTI may have applied.
                log.error("metrics flush refused by Redis, %d series dropped: %s",
                          len(counters) + len(buckets) + len(sums), exc)
                return False
            except Exception as exc:  # noqa: BLE001 - never raise into the flusher or the caller
                self._merge(counters, buckets, sums)
                if not self._failing:
                    log.warning("cannot flush metrics to Redis (kept for the next flush): %s", exc)
                    self._failing = True
                return False
            if self._failing:
                log.info("metrics reach Redis again")
                self._failing = False
            return True

    def _merge(self, counters: dict[Series, float], buckets: dict[tuple[Series, str], int],
               sums: dict[Series, float]) -> None:
        """Put increments a flush could not deliver back in front of those counted meanwhile."""
        with self._lock:
            for key, value in counters.items():
                self._counters[key] = self._counters.get(key, 0) + value
            for bucket, count in buckets.items():
                self._buckets[bucket] = self._buckets.get(bucket, 0) + count
            for key, total in sums.items():
                self._sums[key] = self._sums.get(key, 0.0) + total

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the flusher and flush what is left (at process exit; worker shutdown)."""
        thread = self._thread
        self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        self._thread = None
        self.flush()

    # -- fork ----------------------------------------------------------------------------------------------
    def _after_fork_in_child(self) -> None:
        # The parent flushes what it counted; the child starts from nothing, with fresh locks (one may have
        # been held by a thread the child does not have), no thread and no connection.
        factory = self._client_factory
        self._reset()
        self._client_factory = factory


def _call(ref: weakref.ref[MetricsRecorder], method: str) -> None:
    recorder = ref()
    if recorder is not None:
        getattr(recorder, method)()


# The process's recorder: counts are process-wide by nature (like logging), and it does no I/O until an
# entry point connects it.
_RECORDER = MetricsRecorder()


def recorder() -> MetricsRecorder:
    return _RECORDER


def inc(name: str, value: float = 1, **labels: object) -> None:
    """Count on the process's recorder (see :meth:`MetricsRecorder.inc`)."""
    _RECORDER.inc(name, value, **labels)


def observe(name: str, value: float, **labels: object) -> None:
    """Observe on the process's recorder (see :meth:`MetricsRecorder.observe`)."""
    _RECORDER.observe(name, value, **labels)


def connect_redis(url: str) -> None:
    """Flush this process's counts to the Redis at ``url`` (the broker's)."""
    _RECORDER.connect(lambda: redis.Redis.from_url(url, socket_connect_timeout=_REDIS_TIMEOUT_S,
                                                   socket_timeout=_REDIS_TIMEOUT_S))
