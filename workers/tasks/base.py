"""What every pipeline task shares: its runtime, and turning failures into retries or dead letters."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from celery import Task

from pipeline.deadletters import record_dead_letter
from pipeline.errors import PermanentError
from workers.names import Task as TaskName
from workers.runtime import WorkerRuntime

log = logging.getLogger(__name__)
# Set while a vector index build of a shard is scheduled (the TTL outlives a stuck one).
VECTOR_INDEX_FLAG = "shardfuse:vector_index:scheduled"
VECTOR_INDEX_FLAG_TTL_S = 3600

def message_items(one: Any, many: list[Any] | None) -> list[Any]:
    """The items of a message that carries one (``event=``) or several (``events=``), or both."""
    return ([] if one is None else [one]) + list(many or [])


class PipelineTask(Task):  # type: ignore[misc]
    """Base of the ingest, embed and maintenance tasks."""

    abstract = True
    ignore_result = True

    @property
    def runtime(self) -> WorkerRuntime:
        return self.app.shardfuse_runtime.get()  # type: ignore[no-any-return]

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
            return self._dead_letter(payload, exc)
        except Exception as exc:
            attempts = self.request.retries + 1
            if attempts > settings.workers.max_retries:
                return self._dead_letter(payload, exc)
            countdown = min(60, 2 ** self.request.retries)
            log.warning("%s failed (attempt %d), retrying in %ds: %r", self.name, attempts, countdown, exc)
            raise self.retry(exc=exc, countdown=countdown, max_retries=settings.workers.max_retries) from exc

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
        and dead-lettered one by one when the retry budget is spent. The items that succeeded stay done.
        A failure of the whole of ``work`` (say the database is down) counts for every item. ``carry`` holds
        the message's other arguments, which the retry message keeps.
        """
        try:
            summary, failures = work(items)
        except Exception as whole:  # noqa: BLE001 - settled per item below
            summary, failures = {}, [(item, whole) for item in items]
        dead: list[dict[str, Any]] = []
        transient: list[tuple[Any, BaseException]] = []
        for item, error in failures:
            if isinstance(error, PermanentError):
                dead.append(self._dead_letter({key: item}, error))
            else:
                transient.append((item, error))
        attempts = self.request.retries + 1
        if transient and attempts > self.runtime.settings.workers.max_retries:
            dead.extend(self._dead_letter({key: item}, error) for item, error in transient)
            transient = []
        if transient:
            first = transient[0][1]
            countdown = min(60, 2 ** self.request.retries)
            log.warning("%s: %d of %d %ss failed (attempt %d), retrying them in %ds: %r", self.name,
                        len(transient), len(items), key, attempts, countdown, first)
            kwargs = {**(carry or {}), f"{key}s": [item for item, _ in transient]}
            raise self.retry(kwargs=kwargs, exc=first, countdown=countdown,
                             max_retries=self.runtime.settings.workers.max_retries)
        return summary | {"dead_letters": len(dead)}

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
        return {"result": "dead_letter", "dead_letter_id": dead_id, "reason": reason}

    def schedule_vector_index(self, shard: int) -> None:
        """After a commit to ``shard`` while its HNSW index is deferred: make sure a build will follow (one
        scheduled build per shard at a time; it waits for the queues to empty)."""
        runtime = self.runtime
        if runtime.redis.set(f"{VECTOR_INDEX_FLAG}:{shard}", 1, nx=True, ex=VECTOR_INDEX_FLAG_TTL_S):
            self.app.send_task(TaskName.VECTOR_INDEX_BUILD.value, kwargs={"shard": shard},
                               countdown=runtime.settings.vector_index.build_debounce_s)

    def schedule_bm25(self, shard: int) -> None:
        """After a commit to ``shard``: make sure a (debounced) BM25 rebuild will follow."""
        freshness = self.runtime.freshness
        if freshness.mark_dirty(shard):
            delay = freshness.rebuild_delay(shard, debounce_s=self.runtime.settings.bm25.rebuild_debounce_s)
            self.app.send_task(TaskName.BM25_REBUILD.value, kwargs={"shard": shard}, countdown=delay)
