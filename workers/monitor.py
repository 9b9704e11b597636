"""Read-only views of the running system: queue depths, in-flight work, index freshness, shard counts.

Reads the broker's Redis directly (kombu's Redis transport layout: one list per queue and priority, and
the ``unacked`` hash of delivered-but-unacknowledged messages), so it works with no worker running; and
whether each shard's BM25 index is current from the manifests and PostgreSQL (never from Redis alone, which
can lose data). Redis errors reach callers as ours (:mod:`shardfuse.pipeline.coordination.redis_errors`).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

import redis

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.coordination.redis_errors import redis_errors
from shardfuse.pipeline.core.errors import ShardfuseError
from shardfuse.pipeline.index.lexical import Tokenizer
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.index.store.lag_reader import ShardLagReader
from shardfuse.workers.broker.inbox import inbox_depths
from shardfuse.workers.names import PIPELINE_QUEUES, PUBLISHED_HEADER, Queue

_PRIORITY_SEP = "\x06\x16"
# How long the pipeline must look idle before ``wait_until_indexed`` believes it.
IDLE_SETTLE_S = 1.0
_PRIORITY_STEPS = (0, 3, 6, 9)
_WHAT = "the broker's queues"


def broker_client(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(settings.broker.url, socket_connect_timeout=5, socket_timeout=10)


def queue_depths(client: redis.Redis) -> dict[str, int]:
    """Messages waiting in each queue (all priorities)."""
    pipe = client.pipeline()
    for queue in Queue:
        for step in _PRIORITY_STEPS:
            pipe.llen(queue.value if step == 0 else f"{queue.value}{_PRIORITY_SEP}{step}")
    with redis_errors(client, _WHAT):
        sizes = pipe.execute()
    steps = len(_PRIORITY_STEPS)
    return {q.value: sum(sizes[i * steps:(i + 1) * steps]) for i, q in enumerate(Queue)}


def unacked_by_queue(client: redis.Redis) -> dict[str, int]:
    """Messages delivered to a worker and not yet acknowledged (running, prefetched or waiting for an
    ETA/countdown), per queue; with those a consumer is receiving right now (in its inbox)."""
    with redis_errors(client, _WHAT):
        counts: Counter[str] = Counter(inbox_depths(client))
        unacked = client.hvals("unacked")
    for raw in unacked:
        routing_key = _routing_key(raw)
        if routing_key is not None:
            counts[routing_key] += 1
    return {q.value: counts.get(q.value, 0) for q in Queue}


def _routing_key(entry: bytes | str) -> str | None:
    """The routing key of one ``unacked`` entry, kombu's JSON ``[message, exchange, routing_key]``, read from
    after its last comma: the message holds the whole task body (every chunk of an embed message), and decoding
    all of it cost a watching process the message's size at every look (``shardfuse wait`` looks 4 times a
    second). A string literal cannot hold an unescaped quote, so a tail that decodes as a string is the last
    element (only kombu writes this hash, so an entry ending in one is its triple). Any other entry is decoded
    whole, as before, and not counted unless it is a triple."""
    raw = entry.encode("utf-8") if isinstance(entry, str) else entry  # a client that decodes its replies
    comma = raw.rfind(b",")
    if comma >= 0 and raw.endswith(b"]"):
        try:
            tail = json.loads(raw[comma + 1 : -1])
        except ValueError:
            tail = None
        if isinstance(tail, str):
            return tail
    try:
        _, _, routing_key = json.loads(raw)
    except (ValueError, TypeError):
        return None
    return str(routing_key)


def oldest_waiting_s(client: redis.Redis, *, now: float | None = None) -> dict[str, float | None]:
    """Per queue, how long the message next in line has been waiting since it was (re)published; None when
    the queue is empty or the message carries no publish time (``shardfuse_published``, set by every
    shardfuse publisher: see :func:`shardfuse.workers.app.stamp_published`)."""
    now = time.time() if now is None else now
    ages: dict[str, float | None] = {}
    for queue in Queue:
        pipe = client.pipeline(transaction=False)
        for step in _PRIORITY_STEPS:  # kombu pushes on the left and pops on the right: the oldest is last
            pipe.lindex(queue.value if step == 0 else f"{queue.value}{_PRIORITY_SEP}{step}", -1)
        with redis_errors(client, _WHAT):
            replies = pipe.execute()
        stamps = [_published_at(raw) for raw in replies if raw is not None]
        known = [s for s in stamps if s is not None]
        ages[queue.value] = max(0.0, now - min(known)) if known else None
    return ages


def oldest_in_flight_s(client: redis.Redis, *, now: float | None = None) -> dict[str, float | None]:
    """Per queue, how long ago the longest-held unacknowledged message was delivered (None: none held)."""
    now = time.time() if now is None else now
    # withscores=True: (member, score) pairs, which redis-py's annotation (either shape) cannot tell.
    with redis_errors(client, _WHAT):
        scored = cast("list[tuple[bytes | str, float]]", client.zrange("unacked_index", 0, -1, withscores=True))
        delivered = {t.decode() if isinstance(t, bytes) else str(t): float(at) for t, at in scored}
        messages = client.hmget("unacked", list(delivered)) if delivered else []
    oldest: dict[str, float] = {}
    if delivered:
        tags = list(delivered)
        for tag, raw in zip(tags, messages, strict=True):
            if raw is None:  # acknowledged since the index was read
                continue
            try:
                _, _, routing_key = json.loads(raw)
            except (ValueError, TypeError):
                continue
            queue = str(routing_key)
            oldest[queue] = min(oldest.get(queue, delivered[tag]), delivered[tag])
    return {q.value: (max(0.0, now - oldest[q.value]) if q.value in oldest else None) for q in Queue}


def _published_at(raw: bytes) -> float | None:
    """The publish time a queued message carries. Anyone can put anything on a queue, and a worker sets aside
    what is not a message only when it takes it: such an item next in line has no age."""
    try:
        stamp = json.loads(raw)["headers"].get(PUBLISHED_HEADER)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):  # RecursionError: nested too deep
        return None
    return float(stamp) if isinstance(stamp, int | float) else None


def bm25_freshness(settings: Settings, client: redis.Redis, *,
                   lags: ShardLagReader | None = None) -> list[dict[str, Any]]:
    """Per shard: the published generation and whether it is current: it (with its delta segment) includes
    every document PostgreSQL holds — asked of PostgreSQL (documents changed since the snapshot the index
    was read at), so it holds after Redis lost data — and was built by the configured tokenizer (after a
    tokenizer change every shard needs a rebuild). ``lag_versions`` counts the documents changed since,
    ``behind_s`` how long ago the first of them was written; a shard whose database cannot be read is not
    current (``error`` says why). ``lags``: a reader kept open across calls (one is opened for this call
    when None)."""
    if lags is None:
        with ShardLagReader(settings) as own:
            return bm25_freshness(settings, client, lags=own)
    tracker = Bm25Freshness(client)
    tokenizer = Tokenizer(stem=settings.bm25.stemming).name
    versions = tracker.dirty_versions(settings.shards)
    return [_bm25_row(settings, shard, lags, tokenizer=tokenizer, write_version=versions[shard])
            for shard in range(settings.shards)]


def _bm25_row(settings: Settings, shard: int, lags: ShardLagReader, *, tokenizer: str,
              write_version: int) -> dict[str, Any]:
    try:
        manifest = lags.published_manifest(shard)
    except ShardfuseError as exc:
        return {"shard": shard, "generation": None, "documents": 0, "delta_documents": 0, "built_version": 0,
                "dirty_version": write_version, "tokenizer": None, "current": False, "lag_versions": 0,
                "behind_s": 0.0, "error": str(exc)}
    row: dict[str, Any] = {
        "shard": shard,
        "generation": manifest.generation if manifest else None,
        "documents": manifest.doc_count if manifest else 0,
        # Chunks of documents written since the generation, searchable from its delta segment.
        "delta_documents": manifest.delta_docs if manifest else 0,
        "built_version": manifest.built_version if manifest else 0,
        "dirty_version": write_version,  # the write version (result cache keys): the Redis server's clock
        "tokenizer": manifest.tokenizer if manifest else None,
    }
    try:
        # An index written before versions came from PostgreSQL tracks nothing: behind by every document.
        lag = lags.lag(shard, manifest.built_snapshot if manifest and manifest.tracks_postgres else None)
    except ShardfuseError as exc:
        return {**row, "current": False, "lag_versions": 0, "behind_s": 0.0, "error": str(exc)}
    return {**row, "current": lag.documents == 0 and (manifest is None or manifest.tokenizer == tokenizer),
            "lag_versions": lag.documents, "behind_s": round(lag.behind_s, 3)}


def bm25_lag(settings: Settings, client: redis.Redis, *, lags: ShardLagReader | None = None) -> list[dict[str, Any]]:
    """:func:`bm25_freshness`'s rows: each says how far its index is behind the shard's documents
    (``lag_versions``: documents changed since it; ``behind_s``: since the first of them; 0 when none)."""
    return bm25_freshness(settings, client, lags=lags)


def stale_shards(settings: Settings, client: redis.Redis, *, lags: ShardLagReader | None = None) -> list[int]:
    """Shards whose BM25 index is known to be behind (manifests, and one indexed query per shard: cheap,
    unlike reading unacked). A shard whose database cannot be read is not among them: a rebuild sent now
    would only fail."""
    return [row["shard"] for row in bm25_freshness(settings, client, lags=lags)
            if not row["current"] and "error" not in row]


def pending_work(settings: Settings, client: redis.Redis, *, lags: ShardLagReader | None = None) -> dict[str, Any]:
    """Work waiting or in flight per pipeline queue, the shards whose BM25 index is behind, those whose
    database could not be read (``unknown_shards``), and whether all of it is nothing (``idle``)."""
    depths = queue_depths(client)
    unacked = unacked_by_queue(client)
    pending = {q.value: depths[q.value] + unacked[q.value] for q in PIPELINE_QUEUES}
    rows = bm25_freshness(settings, client, lags=lags)
    stale = [row["shard"] for row in rows if not row["current"] and "error" not in row]
    unknown = [row["shard"] for row in rows if "error" in row]
    return {"pending": pending, "stale_shards": stale, "unknown_shards": unknown,
            "idle": not any(pending.values()) and not stale and not unknown}


class LostRebuilds:
    """Shards whose BM25 index stays behind with no maintenance work waiting or running anywhere: the
    rebuild message was lost (its send failed, with the broker down, after the write took the schedule
    flag; or Redis lost the message, or the commit's bookkeeping never ran), and the shard would stay stale
    until the next write to it. Fed :func:`pending_work` states,
    :meth:`due` names the shards to send a rebuild for (again at most once per grace)."""

    def __init__(self, settings: Settings) -> None:
        self.grace_s = settings.bm25.rebuild_debounce_s + 5
        self._since: dict[int, float] = {}

    def due(self, state: dict[str, Any], now: float) -> list[int]:
        stale = set(state["stale_shards"])
        self._since = {shard: since for shard, since in self._since.items() if shard in stale}
        if not stale or state["pending"][Queue.MAINTENANCE.value]:
            return []
        due = []
        for shard in sorted(stale):
            if now - self._since.setdefault(shard, now) > self.grace_s:
                due.append(shard)
                self._since[shard] = now
        return due


def wait_until_indexed(
    settings: Settings,
    *,
    timeout: float,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    reschedule: Callable[[int], None] | None = None,
    poll_s: float = 0.25,
) -> bool:
    """Block until every published event is indexed and searchable: the pipeline queues hold nothing
    (waiting or in flight) and every shard's BM25 index includes every document PostgreSQL holds.

    ``reschedule(shard)`` is called for a shard that stays stale with no maintenance work anywhere, which
    can only mean its rebuild message was lost; it should publish a rebuild.
    """
    with ShardLagReader(settings) as lags:
        return _wait_until_indexed(settings, lags, timeout=timeout, on_progress=on_progress, reschedule=reschedule,
                                   poll_s=poll_s)


def _wait_until_indexed(
    settings: Settings,
    lags: ShardLagReader,
    *,
    timeout: float,
    on_progress: Callable[[dict[str, Any]], None] | None,
    reschedule: Callable[[int], None] | None,
    poll_s: float,
) -> bool:
    client = broker_client(settings)
    deadline = time.monotonic() + timeout
    lost = LostRebuilds(settings)
    idle_since: float | None = None
    while True:
        state = pending_work(settings, client, lags=lags)
        if on_progress is not None:
            on_progress(state)
        now = time.monotonic()
        # Every hand-over keeps the work visible (a retry is published before its original is acknowledged,
        # a received message is in its consumer's inbox until it is recorded as unacked); idle must still
        # hold for IDLE_SETTLE_S, since the queues, unacked and the shards are read one after another.
        if not state["idle"]:
            idle_since = None
        elif idle_since is None:
            idle_since = now
        elif now - idle_since >= IDLE_SETTLE_S:
            return True
        if now >= deadline:
            return False
        for shard in lost.due(state, now):
            if reschedule is not None:
                reschedule(shard)
        time.sleep(poll_s)
