"""What every pipeline task shares: its runtime, and turning failures into retries or dead letters."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any, NoReturn

import psycopg
import redis
from celery import Task
from celery.exceptions import Reject
from kombu.exceptions import OperationalError as KombuOperationalError

from shardfuse.pipeline.admin.dead_letters import record_dead_letter
from shardfuse.pipeline.coordination.leases import DocumentLeases, Lease
from shardfuse.pipeline.core.errors import (
    DocumentBusyError,
    InvalidEventError,
    LeaseLostError,
    PermanentError,
    StoreUnavailableError,
)
from shardfuse.pipeline.index.lexical.freshness import message_documents
from shardfuse.pipeline.observability import metrics
from shardfuse.workers.logs import item_fields, log_context
from shardfuse.workers.names import TASK_QUEUES
from shardfuse.workers.names import Task as TaskName
from shardfuse.workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)
# Set while a vector index build of a shard is scheduled (the TTL outlives a stuck one).
VECTOR_INDEX_FLAG = "shardfuse:vector_index:scheduled"
VECTOR_INDEX_FLAG_TTL_S = 3600
# A message whose failures could not be recorded waits this long before it goes back on its queue.
REQUEUE_PAUSE_S = 2.0
# What "could not be recorded" means: the dead-letter table or the broker was out of reach.
UNREACHABLE = (StoreUnavailableError, psycopg.OperationalError, redis.ConnectionError, redis.TimeoutError,
               KombuOperationalError, OSError)

# The stage label of a task's metrics: its queue.
_STAGES = {task.value: queue.value for task, queue in TASK_QUEUES.items()}


def message_items(one: Any, many: list[Any] | None) -> list[Any]:
    """The items of a message that carries one (``event=``) or several (``events=``), or both."""
    return ([] if one is None else [one]) + list(many or [])


def take_lease(leases: DocumentLeases, zone: str, path: str) -> Lease:
    """The document's lease, or :class:`DocumentBusyError` while another live worker holds it."""
    lease = leases.acquire(zone, path)
    if lease is None:
        raise DocumentBusyError(f"[{zone}] {path} is being worked on by {leases.holder_of(zone, path)}")
    return lease


@contextlib.contextmanager
def leased(leases: DocumentLeases, zone: str, path: str) -> Iterator[Lease]:
    """Hold the document's lease while the block runs; :class:`DocumentBusyError` if another live worker
    holds it. A :class:`LeaseLostError` from the block raises the token counter past the shard's."""
    lease = take_lease(leases, zone, path)
    try:
        yield lease
    except LeaseLostError as exc:
        leases.raise_floor(exc.stored_fence)
        raise
    finally:
        leases.release(lease)


class PipelineTask(Task):  # type: ignore[misc]
    """Base of the ingest, embed and maintenance tasks."""

    abstract = True
    ignore_result = True

    @property
    def runtime(self) -> WorkerRuntime:
        return self.app.shardfuse_runtime.get()  # type: ignore[no-any-return]

    def count(self, outcome: str, value: int = 1) -> None:
        """Count ``value`` items of this task's stage (its queue) settled as ``outcome``."""
        if value:
            metrics.inc(metrics.EVENTS, value, stage=_STAGES.get(self.name, self.name), outcome=outcome)

    def guarded(self, payload: dict[str, Any], work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run ``work``; dead-letter a :class:`PermanentError` at once, retry anything else with exponential
        backoff and dead-letter it when the retry budget is spent.

        Failures that are not ours (a soft time limit, a timeout, a bug) count as transient: bounded by the
        budget, a bug dead-letters after a few tries instead of vanishing. A retry re-publishes the message
        before the original is acknowledged, so nothing is lost between.
        """
        settings = self.runtime.settings
        try:
            return work()
        except PermanentError as exc:
            return self._settled(partial(self._dead_letter, payload, exc))
        except Exception as exc:
            attempts = self.request.retries + 1
            if attempts > settings.workers.max_retries:
                return self._settled(partial(self._dead_letter, payload, exc))
            countdown = min(60, 2 ** self.request.retries)
            log.warning("%s failed (attempt %d), retrying in %ds: %r", self.name, attempts, countdown, exc)
            self.count("retried")
            return self._settled(partial(self._retry, exc, countdown=countdown))

    def guarded_each(
        self,
        key: str,
        items: Sequence[Any],
        work: Callable[[Sequence[Any]], tuple[dict[str, Any], list[tuple[Any, BaseException]]]],
        *,
        carry: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Run ``work`` over a message of several items (``key`` names one: ``event``, ``document``), which
        returns a summary and the items that failed, each with its error.

        Each item is settled on its own: a permanent failure is dead-lettered alone, transient ones are
        retried together in a new message holding only them (re-published before this one is acknowledged),
        and dead-lettered one by one when the retry budget is spent. Items whose document another live
        worker holds (:class:`DocumentBusyError`) go back in a message of their own after
        ``delivery.busy_retry_s``, without spending the budget. The items that succeeded stay done. A
        failure of the whole of ``work`` (say the database is down) counts for every item. ``carry`` holds
        the message's other arguments, which the retry message keeps.

        If settling itself fails (the dead-letter table or the broker is unreachable), the whole message
        goes back on its queue: every item is idempotent, so the ones already done are no-ops next time.
        """
        try:
            summary, failures = work(items)
        except Exception as whole:  # noqa: BLE001 - settled per item below
            summary, failures = {}, [(item, whole) for item in items]
        return self._settled(lambda: summary | self._settle_each(key, items, failures, carry or {}))

    def refuse_malformed(self, arguments: dict[str, Any], unknown: dict[str, Any], *,
                         lists: Sequence[str]) -> dict[str, Any] | None:
        """Dead-letter, whole and at once, a message that is not what the task takes: an argument it does
        not know (``unknown``), or one of ``lists`` that is not a list. None when the message is fine.

        Such a message would otherwise fail in Celery's call of the task, before any of our code runs, and
        be acknowledged with its failure recorded nowhere.
        """
        problems = [f"unknown argument(s) {', '.join(sorted(unknown))}"] if unknown else []
        problems += [f"{name} must be a list, got {type(arguments[name]).__name__}" for name in lists
                     if arguments.get(name) is not None and not isinstance(arguments[name], list)]
        if not problems:
            return None
        error = InvalidEventError(f"malformed {self.name} message: {'; '.join(problems)}")
        return self._settled(partial(self._dead_letter, {**arguments, **unknown}, error))

    def _settle_each(self, key: str, items: Sequence[Any], failures: list[tuple[Any, BaseException]],
                     carry: dict[str, Any]) -> dict[str, Any]:
        settings = self.runtime.settings
        dead: list[dict[str, Any]] = []
        transient: list[tuple[Any, BaseException]] = []
        busy: list[Any] = []
        for item, error in failures:
            if isinstance(error, PermanentError):
                with log_context(**item_fields(item)):
                    dead.append(self._dead_letter({key: item}, error))
            elif isinstance(error, DocumentBusyError):
                busy.append(item)
            else:
                transient.append((item, error))
        if busy:
            log.info("%s: %d %s(s) held by another worker, trying again in %.1fs", self.name, len(busy), key,
                     settings.delivery.busy_retry_s)
            self.app.send_task(self.name, kwargs={**carry, f"{key}s": busy},
                               countdown=settings.delivery.busy_retry_s)
            self.count("busy", len(busy))
        attempts = self.request.retries + 1
        if transient and attempts > settings.workers.max_retries:
            for item, error in transient:
                with log_context(**item_fields(item)):
                    dead.append(self._dead_letter({key: item}, error))
            transient = []
        if transient:
            first = transient[0][1]
            countdown = min(60, 2 ** self.request.retries)
            log.warning("%s: %d of %d %ss failed (attempt %d), retrying them in %ds: %r", self.name,
                        len(transient), len(items), key, attempts, countdown, first)
            self.count("retried", len(transient))
            self._retry(first, countdown=countdown, kwargs={**carry, f"{key}s": [item for item, _ in transient]})
        return {"dead_letters": len(dead), "busy": len(busy)}

    def _retry(self, exc: BaseException, *, countdown: float, kwargs: dict[str, Any] | None = None) -> NoReturn:
        try:
            raise self.retry(kwargs=kwargs, exc=exc, countdown=countdown,
                             max_retries=self.runtime.settings.workers.max_retries)
        except Reject as refused:
            # Celery raises Reject(requeue=False) when it cannot publish the retry message (the broker is
            # restarting): the message would be dropped. Put it back on its queue instead.
            self._requeue(f"could not publish its retry ({refused.reason})", refused)

    def _settled(self, settle: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run ``settle`` (dead-letter, retry); if the database or the broker cannot be reached to do it,
        put the message back on its queue rather than let Celery acknowledge a message whose failure was
        recorded nowhere. (Anything else that breaks here is a bug: the task fails, visibly, in the worker's
        log and in Flower, instead of coming back forever.)"""
        try:
            return settle()
        except UNREACHABLE as exc:
            self._requeue(f"could not record its failures ({exc!r})", exc)

    def _requeue(self, why: str, cause: BaseException) -> NoReturn:
        """Put the whole message back on its queue (not acknowledged), after a pause that gives whatever is
        down a moment before the message runs again."""
        log.error("%s %s; the message goes back on its queue in %.0fs", self.name, why, REQUEUE_PAUSE_S)
        time.sleep(REQUEUE_PAUSE_S)
        raise Reject(why, requeue=True) from cause

    def _dead_letter(self, payload: dict[str, Any], exc: BaseException) -> dict[str, Any]:
        reason = str(exc) or exc.__class__.__name__
        attempts = self.request.retries + 1
        dead_id = record_dead_letter(
            self.runtime.shared_pool,
            task=self.name,
            payload=payload,
            error_class=f"{exc.__class__.__module__}.{exc.__class__.__qualname__}",
            reason=reason,
            attempts=attempts,
        )
        log.error("%s dead-lettered as #%d after %d attempt(s): %s", self.name, dead_id, attempts, reason)
        self.count("dead_lettered")
        return {"result": "dead_letter", "dead_letter_id": dead_id, "reason": reason}

    def schedule_vector_index(self, shard: int) -> None:
        """After a commit to ``shard`` while its HNSW index is deferred: make sure a build will follow (one
        scheduled build per shard at a time; it waits for the queues to empty)."""
        runtime = self.runtime
        if runtime.redis.set(f"{VECTOR_INDEX_FLAG}:{shard}", 1, nx=True, ex=VECTOR_INDEX_FLAG_TTL_S):
            self.app.send_task(TaskName.VECTOR_INDEX_BUILD.value, kwargs={"shard": shard},
                               countdown=runtime.settings.vector_index.build_debounce_s)

    def schedule_bm25(self, shard: int, keys: Iterable[tuple[str, str]] | None = None) -> None:
        """After a commit to ``shard`` of the documents ``keys`` (``(zone, path)``; when None, those of this
        task's message): record them and make sure a (debounced) BM25 update follows. The update indexes
        them as a delta segment; documents that cannot be named cost a full rebuild instead."""
        freshness = self.runtime.freshness
        if keys is None:
            keys = message_documents(dict(getattr(self.request, "kwargs", None) or {}))
        if freshness.mark_dirty(shard, keys):
            self.app.send_task(TaskName.BM25_REBUILD.value, kwargs={"shard": shard},
                               countdown=self.runtime.settings.bm25.delta_debounce_s)
