"""Queue and task names: the wire contract between publishers, workers and RPC callers."""

from __future__ import annotations

import enum


class Queue(enum.StrEnum):
    INGEST = "ingest"
    EMBED = "embed"
    MAINTENANCE = "maintenance"
    QUERY = "query"


class Task(enum.StrEnum):
    INGEST = "shardfuse.ingest"
    EMBED = "shardfuse.embed"
    BM25_REBUILD = "shardfuse.bm25_rebuild"
    VECTOR_INDEX_BUILD = "shardfuse.vector_index_build"
    SEARCH = "shardfuse.search"


# Which queue each task is routed to.
TASK_QUEUES: dict[Task, Queue] = {
    Task.INGEST: Queue.INGEST,
    Task.EMBED: Queue.EMBED,
    Task.BM25_REBUILD: Queue.MAINTENANCE,
    Task.VECTOR_INDEX_BUILD: Queue.MAINTENANCE,
    Task.SEARCH: Queue.QUERY,
}

# The pool type each queue's workers run: CPU-bound stages fork, I/O-bound stages use threads.
QUEUE_POOLS: dict[Queue, str] = {
    Queue.INGEST: "prefork",
    Queue.EMBED: "threads",
    Queue.MAINTENANCE: "prefork",
    Queue.QUERY: "threads",
}

# Messages each worker process reserves beyond the ones it runs (Celery's prefetch multiplier). Long
# pipeline tasks take one at a time so a busy process never hoards work another could start; searches are
# short, and a few reserved ones hide the broker round trip.
QUEUE_PREFETCH: dict[Queue, int] = {
    Queue.INGEST: 1,
    Queue.EMBED: 1,
    Queue.MAINTENANCE: 1,
    Queue.QUERY: 4,
}

# The message header holding when a message was (re)published (seconds since the epoch): how long the
# oldest message of a queue has waited (``shardfuse status``).
PUBLISHED_HEADER = "shardfuse_published"

# Queues whose backlog means "published but not yet searchable".
PIPELINE_QUEUES: tuple[Queue, ...] = (Queue.INGEST, Queue.EMBED, Queue.MAINTENANCE)
