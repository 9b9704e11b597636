"""What shardfuse counts, defined once with ``prometheus_client``, and the two calls domain code makes.

Each process counts what it does (events settled, chunks embedded, provider 429s, query latencies) with
:func:`inc` and :func:`observe`; Prometheus adds the processes up when it scrapes them (``sum by (…)``).
Nothing is summed anywhere else: no flush to a shared store, no count applied twice after a lost reply.

Celery's prefork pools run tasks in child processes that one HTTP endpoint cannot ask. For them
``prometheus_client``'s multiprocess mode keeps each process's values in a file of its own under
``PROMETHEUS_MULTIPROC_DIR`` (an mmap written at every increment) and the pool's main process adds the files
up at each scrape (:mod:`shardfuse.pipeline.observability.multiprocess`): one ``/metrics`` per pool, exact,
and a child that dies, even killed, keeps its counts there until the pool restarts. ``prometheus_client``
chooses the mode when it is imported, from that variable, so the process's launcher sets it in the child's
environment; nothing here reads or writes settings.

Names follow Prometheus's conventions (``shardfuse_`` namespace, counters end in ``_total``, durations in
``_seconds``) and are those earlier releases exported, so dashboards keep working. Each metric has a fixed
label set: counting with other labels raises ``ValueError`` (a bug, not a new series). Label values are
bounded (stages, outcomes, providers, configured models, query modes).

The metric objects are module-level and registered in ``prometheus_client``'s default registry, as that
library intends: counts are process-wide by nature (like :mod:`logging`'s loggers), and a metric does no I/O
and holds no file until a process counts on it.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

NAMESPACE = "shardfuse"
# Upper bounds, in seconds, of the query histogram's buckets (above the last: +Inf).
BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)
# Upper bounds, in seconds, of the freshness histogram's buckets: from an idle pipeline's sub-second path to a
# bulk load's backlog. 60 is the freshness objective of config/prometheus/alerts.yml (a bucket bound, so the
# share of changes slower than it is exact).
FRESHNESS_BUCKETS_S = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 1800.0, 3600.0)
_EMBEDDING = ("provider", "model")

EVENTS_PUBLISHED = Counter(
    "events_published", "Write and delete events published to the ingest queue (by the publishing process).",
    ["op"], namespace=NAMESPACE)  # op: write | delete
EVENTS = Counter(
    "events", "Work items settled by each pipeline stage (ingest: events, embed: documents, maintenance: "
              "messages), by outcome.",
    ["stage", "outcome"], namespace=NAMESPACE)  # stage: ingest | embed | maintenance; outcome: see workers/tasks
EMBEDDING_CHUNKS = Counter(
    "embedding_chunks", "Chunks handed to the embedding stage (cache hits included).", _EMBEDDING,
    namespace=NAMESPACE)
EMBEDDING_CACHE_HITS = Counter(
    "embedding_cache_hits", "Distinct chunk texts the embedding cache answered.", _EMBEDDING, namespace=NAMESPACE)
EMBEDDING_CACHE_MISSES = Counter(
    "embedding_cache_misses", "Distinct chunk texts the embedding cache did not hold.", _EMBEDDING,
    namespace=NAMESPACE)
EMBEDDING_TEXTS = Counter(
    "embedding_texts_embedded", "Chunk texts the embedding provider embedded.", _EMBEDDING, namespace=NAMESPACE)
EMBEDDING_TOKENS = Counter(
    "embedding_tokens", "Tokens sent to the embedding provider.", _EMBEDDING, namespace=NAMESPACE)
EMBEDDING_REQUESTS = Counter(
    "embedding_requests", "Embedding provider requests, by final outcome (after retries).",
    [*_EMBEDDING, "outcome"], namespace=NAMESPACE)  # outcome: ok | failed
EMBEDDING_OVERSIZE = Counter(
    "embedding_oversize_chunks", "Distinct chunk texts over the embedding model's per-input token limit (in its own "
    "tokenizer), by how they were embedded: truncated (the rest was not read) or split (windows averaged).",
    [*_EMBEDDING, "handling"], namespace=NAMESPACE)  # handling: truncated | split
PROVIDER_RATE_LIMITED = Counter(
    "provider_rate_limited", "Provider answers that were HTTP 429 (rate limited).", ["provider"],
    namespace=NAMESPACE)
PROVIDER_RETRIES = Counter(
    "provider_retries", "Provider calls retried after a transient failure (429, 5xx, timeout, reset).",
    ["provider"], namespace=NAMESPACE)
QUERY_DURATION = Histogram(
    "query_duration_seconds", "Time the search task took, by mode and outcome.", ["mode", "outcome"],
    namespace=NAMESPACE, buckets=BUCKETS_S)  # outcome: ok | cached | invalid | error
FRESHNESS = Histogram(
    "freshness_seconds", "Seconds from a change's publication to its commit in its shard, when the vector and grep "
    "legs find it (the keyword leg follows at the shard's next BM25 delta: shardfuse_bm25_behind_seconds), by op.",
    ["op"], namespace=NAMESPACE, buckets=FRESHNESS_BUCKETS_S)  # op: write | delete
RERANKS = Counter(
    "reranks", "Rerank steps after fusion, by provider and outcome (all but applied kept the fused order).",
    ["provider", "outcome"], namespace=NAMESPACE)
# outcome: applied | rate_limited | timeout | unavailable | malformed | refused (query/rerank/stage.py)


def inc(counter: Counter, value: float = 1, **labels: object) -> None:
    """Add ``value`` (0 or more) to ``counter``'s series of these labels (all of its labels, no other)."""
    counter.labels(**{name: str(v) for name, v in labels.items()}).inc(value)


def observe(histogram: Histogram, value: float, **labels: object) -> None:
    """Record one observation (seconds) in ``histogram``'s series of these labels."""
    histogram.labels(**{name: str(v) for name, v in labels.items()}).observe(value)
