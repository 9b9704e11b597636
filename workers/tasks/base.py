"""What every pipeline task shares: its runtime, settling failures (dead letter, retry, wait) and sending
the work that follows a commit."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, NoReturn

from celery import Celery, Task
from celery.exceptions import Reject, TimeLimitExceeded
from kombu.exceptions import OperationalError as KombuOperationalError

from shardfuse.pipeline.admin.dead_letters import record_dead_letter
from shardfuse.pipeline.coordination.build_schedule import VectorIndexSchedule
from shardfuse.pipeline.core import failpoints
from shardfuse.pipeline.core.errors import InvalidEventError, StoreUnavailableError, TransientError
from shardfuse.pipeline.core.failpoints import Failpoint
from shardfuse.pipeline.observability import metrics
from shardfuse.workers.logs import item_fields, log_context
from shardfuse.workers.names import TASK_QUEUES
from shardfuse.workers.names import Task as TaskName
from shardfuse.workers.runtime import WorkerRuntime
from shardfuse.workers.task_reprs import kwargs_summary
from shardfuse.workers.tasks.settlement import Verdict, retry_countdown, settle, verdict
from shardfuse.workers.tasks.strikes import MAX_STRIKES, HardLimitStrikes, HardTimeLimitError, message_items_of

log = logging.getLogger(__name__)
# A message whose failures could not be recorded waits this long before it goes back on its queue.
REQUEUE_PAUSE_S = 2.0

# The stage label of a task's metrics: its queue.
_STAGES = {task.value: queue.value for task, queue in TASK_QUEUES.items()}
# The work of a message of several items: a summary, and the items that failed, each with its error.
ItemsWork = Callable[[Sequence[Any]], tuple[dict[str, Any], Sequence[tuple[Any, BaseException]]]]


def pipeline_task(app: Celery, name: TaskName) -> Callable[[Callable[..., dict[str, Any]]], Any]:
    """``app.task`` for a pipeline task named ``name``: bound, a :class:`PipelineTask`. Its time limits come
    from the app's settings (``task_annotations``, :func:`shardfuse.workers.app.task_limits`)."""
    decorator: Callable[[Callable[..., dict[str, Any]]], Any] = app.task(name=name.value, bind=True,
                                                                        base=PipelineTask)
    return decorator


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

    @property
    def attempts(self) -> int:
        """This run of the message: 1 for its first delivery, one more for each retry."""
        return int(self.request.retries) + 1

    def count(self, outcome: str, value: int = 1) -> None:
        """Count ``value`` items of this task's stage (its queue) settled as ``outcome``."""
        if value:
            metrics.inc(metrics.EVENTS, value, stage=_STAGES.get(self.name, self.name), outcome=outcome)

    def guarded(self, payload: dict[str, Any], work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run ``work``; dead-letter a :class:`PermanentError` at once, retry anything else with backoff and
        dead-letter it when the retry budget is spent (:func:`~shardfuse.workers.tasks.settlement.verdict`).
        A retry re-publishes the message before the original is acknowledged, so nothing is lost between.
        """
        (struck,) = self._struck_out([payload])
        if struck is not None:
            return self._settled(partial(self._dead_letter, payload, struck))
        try:
            return work()
        except Exception as exc:  # noqa: BLE001 - settled by its verdict
            return self._settled(partial(self._settle_whole, payload, exc))

    def guarded_each(self, key: str, items: Sequence[Any], work: ItemsWork, *,
                     carry: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run ``work`` over a message of several items (``key`` names one: ``event``, ``document``), which
        returns a summary and the items that failed, each with its error.

        Each item is settled on its own (:func:`~shardfuse.workers.tasks.settlement.settle`): a permanent
        failure is dead-lettered alone, transient ones are retried together in a new message holding only
        them (re-published before this one is acknowledged), and dead-lettered one by one when the retry
        budget is spent. Items whose document another live worker holds go back in a message of their own
        after ``delivery.busy_retry_s``, without spending the budget. The items that succeeded stay done.
        A failure of the whole of ``work`` (say the database is down) counts for every item. ``carry``
        holds the message's other arguments, which the retry message keeps.

        If settling itself fails (the dead-letter table or the broker is unreachable), the whole message
        goes back on its queue: every item is idempotent, so the ones already done are no-ops next time.
        An item that was in :data:`~shardfuse.workers.tasks.strikes.MAX_STRIKES` runs the hard time limit
        killed is not run again: it is dead-lettered with that reason.
        """
        verdicts = self._struck_out(items)
        struck = [(item, error) for item, error in zip(items, verdicts, strict=True) if error is not None]
        runnable = [item for item, error in zip(items, verdicts, strict=True) if error is None]
        try:
            summary, failures = work(runnable) if runnable else ({}, [])
        except Exception as whole:  # noqa: BLE001 - settled per item below
            summary, failures = {}, [(item, whole) for item in runnable]
        failures = [*struck, *failures]
        return self._settled(lambda: summary | self._settle_each(key, len(items), failures, carry or {}))

    def refuse_malformed(self, arguments: dict[str, Any], unknown: dict[str, Any], *,
                         lists: Sequence[str] = (), shard: str | None = None) -> dict[str, Any] | None:
        """Dead-letter, whole and at once, a message that is not what the task takes: an argument it does
        not know (``unknown``), one of ``lists`` that is not a list, or an argument named ``shard`` that is no
        shard number of this deployment. None when the message is fine.

        Such a message would otherwise fail in Celery's call of the task, before any of our code runs, and
        be acknowledged with its failure recorded nowhere.
        """
        problems = [f"unknown argument(s) {', '.join(sorted(unknown))}"] if unknown else []
        problems += [f"{name} must be a list, got {type(arguments[name]).__name__}" for name in lists
                     if arguments.get(name) is not None and not isinstance(arguments[name], list)]
        if shard is not None:
            value, shards = arguments.get(shard), self.runtime.settings.shards
            if type(value) is not int or not 0 <= value < shards:
                problems.append(f"{shard} must be a shard number from 0 to {shards - 1}, got {value!r}"[:300])
        if not problems:
            return None
        error = InvalidEventError(f"malformed {self.name} message: {'; '.join(problems)}")
        return self._settled(partial(self._dead_letter, {**arguments, **unknown}, error))

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        """Celery's failure hook. A kill by the hard time limit is reported here, in the worker's main process,
        before the message goes back on its queue (``task_acks_on_timeout=False``): count it as a strike."""
        if not isinstance(exc, TimeLimitExceeded):
            return
        try:
            strikes = HardLimitStrikes(self.runtime.redis).record(message_items_of(kwargs))
        except TransientError as error:
            log.error("%s[%s] was killed by its hard time limit and goes back on its queue; its strike could not "
                      "be recorded: %s", self.name, task_id, error)
            return
        log.error("%s[%s] was killed by its hard time limit (its items' strike %d of %d) and goes back on its "
                  "queue%s", self.name, task_id, strikes, MAX_STRIKES,
                  "; next time they are dead-lettered" if strikes >= MAX_STRIKES else "")

    def _struck_out(self, items: Sequence[Any]) -> list[HardTimeLimitError | None]:
        """For each item, the error to dead-letter it with if runs the hard time limit killed held it too often."""
        try:
            counts = HardLimitStrikes(self.runtime.redis).counts(items)
        except TransientError as exc:  # cannot tell: run them (at worst they earn one more strike)
            log.warning("%s: cannot read its items' hard time limit strikes: %s", self.name, exc)
            return [None] * len(items)
        return [HardTimeLimitError.struck_out(strikes=n, hard_limit_s=self.time_limit) if n >= MAX_STRIKES else None
                for n in counts]

    def _settle_whole(self, payload: dict[str, Any], exc: BaseException) -> dict[str, Any]:
        # A whole message holds no document lease: waiting is retrying.
        if verdict(exc, attempts=self.attempts, max_retries=self._max_retries) is Verdict.DEAD_LETTER:
            return self._dead_letter(payload, exc)
        countdown = retry_countdown(self.request.retries)
        log.warning("%s failed (attempt %d), retrying in %.1fs: %r", self.name, self.attempts, countdown, exc)
        self.count("retried")
        self._retry(exc, countdown=countdown)

    def _settle_each(self, key: str, total: int, failures: Iterable[tuple[Any, BaseException]],
                     carry: dict[str, Any]) -> dict[str, Any]:
        plan = settle(failures, attempts=self.attempts, max_retries=self._max_retries)
        for item, error in plan.dead:
            with log_context(**item_fields(item)):
                self._dead_letter({key: item}, error)
        if plan.wait:
            wait_s = self.runtime.settings.delivery.busy_retry_s
            log.info("%s: %d %s(s) held by another worker, trying again in %.1fs", self.name, len(plan.wait), key,
                     wait_s)
            self.publish(self.name, {**carry, f"{key}s": list(plan.wait)}, countdown=wait_s)
            self.count("busy", len(plan.wait))
        if plan.retry:
            first = plan.retry[0][1]
            countdown = retry_countdown(self.request.retries)
            log.warning("%s: %d of %d %ss failed (attempt %d), retrying them in %.1fs: %r", self.name,
                        len(plan.retry), total, key, self.attempts, countdown, first)
            self.count("retried", len(plan.retry))
            self._retry(first, countdown=countdown, kwargs={**carry, f"{key}s": [item for item, _ in plan.retry]})
        return {"dead_letters": len(plan.dead), "busy": len(plan.wait)}

    @property
    def _max_retries(self) -> int:
        return self.runtime.settings.workers.max_retries

    def _retry(self, exc: BaseException, *, countdown: float, kwargs: dict[str, Any] | None = None) -> NoReturn:
        try:
            raise self.retry(kwargs=kwargs, exc=exc, countdown=countdown, max_retries=self._max_retries)
        except Reject as refused:
            # Celery raises Reject(requeue=False) when it cannot publish the retry message (the broker is
            # restarting): the message would be dropped. Put it back on its queue instead.
            self._requeue(f"could not publish its retry ({refused.reason})", refused)

    def _settled(self, settle_: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run ``settle_`` (dead-letter, retry, wait); if the database or the broker cannot be reached to do
        it (a :class:`TransientError`: the adapters translate "unreachable" into
        :class:`StoreUnavailableError`), put the message back on its queue rather than let Celery
        acknowledge a message whose failure was recorded nowhere. (Anything else that breaks here is a bug:
        the task fails, visibly, in the worker's log and in Flower, instead of coming back forever.)"""
        try:
            return settle_()
        except TransientError as exc:
            self._requeue(f"could not record its failures ({exc!r})", exc)

    def _requeue(self, why: str, cause: BaseException) -> NoReturn:
        """Put the whole message back on its queue (not acknowledged), after a pause that gives whatever is
        down a moment before the message runs again."""
        log.error("%s %s; the message goes back on its queue in %.0fs", self.name, why, REQUEUE_PAUSE_S)
        time.sleep(REQUEUE_PAUSE_S)
        raise Reject(why, requeue=True) from cause

    def _dead_letter(self, payload: dict[str, Any], exc: BaseException) -> dict[str, Any]:
        reason = str(exc) or exc.__class__.__name__
        dead_id = record_dead_letter(
            self.runtime.shared_pool,
            task=self.name,
            payload=payload,
            error_class=f"{exc.__class__.__module__}.{exc.__class__.__qualname__}",
            reason=reason,
            attempts=self.attempts,
        )
        log.error("%s dead-lettered as #%d after %d attempt(s): %s", self.name, dead_id, self.attempts, reason)
        self.count("dead_lettered")
        return {"result": "dead_letter", "dead_letter_id": dead_id, "reason": reason}

    def publish(self, name: str, kwargs: dict[str, Any], *, countdown: float | None = None) -> None:
        """Send a message of task ``name``; :class:`StoreUnavailableError` when the broker cannot take it."""
        options = {} if countdown is None else {"countdown": countdown}
        try:
            self.app.send_task(name, kwargs=kwargs, kwargsrepr=kwargs_summary(kwargs), **options)
        except KombuOperationalError as exc:
            raise StoreUnavailableError(f"cannot publish {name} to the broker: {exc}") from exc

    def after_commits(self, committed: Mapping[int, Sequence[tuple[str, str]]], *,
                      vector_index: bool = False) -> None:
        """After commits to shards (``committed``: per shard, the documents written): schedule each shard's
        BM25 update, which indexes just these documents as a delta; with ``vector_index``, also the HNSW
        build of a shard whose index a bulk load deferred."""
        if committed:
            failpoints.reach(Failpoint.AFTER_COMMIT, self.runtime.settings.failpoints)
        for shard, keys in sorted(committed.items()):
            self.schedule_bm25(shard, keys)
            if vector_index and self.runtime.bulk_load_gate.deferred(shard):
                self.schedule_vector_index(shard)

    def schedule_vector_index(self, shard: int) -> None:
        """After a commit to ``shard`` while its HNSW index is deferred: make sure a build will follow (one
        scheduled build per shard at a time; it waits for the queues to empty)."""
        runtime = self.runtime
        if VectorIndexSchedule(runtime.redis).claim(shard):
            self.publish(TaskName.VECTOR_INDEX_BUILD.value, {"shard": shard},
                         countdown=runtime.settings.vector_index.build_debounce_s)

    def clear_vector_index_schedule(self, shard: int) -> None:
        """Let the next commit to ``shard`` schedule a build again."""
        VectorIndexSchedule(self.runtime.redis).clear(shard)

    def schedule_bm25(self, shard: int, keys: Iterable[tuple[str, str]]) -> None:
        """After a commit to ``shard`` of the documents ``keys`` (``(zone, path)``): record them and make
        sure a (debounced) BM25 update follows, which indexes them as a delta segment."""
        if self.runtime.freshness.mark_dirty(shard, keys):
            self.publish(TaskName.BM25_REBUILD.value, {"shard": shard},
                         countdown=self.runtime.settings.bm25.delta_debounce_s)
