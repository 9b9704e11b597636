"""What becomes of work that failed: dead letter, retry, or wait for the worker holding its document.

Decided from the error's family and the retry budget alone, with no Celery here:
:class:`~shardfuse.workers.tasks.base.PipelineTask` carries the decisions out.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from shardfuse.pipeline.core.errors import DocumentBusyError, PermanentError

T = TypeVar("T")

# The longest wait before a retry, and the exponent past which the cap holds anyway.
MAX_BACKOFF_S = 60.0
_MAX_EXPONENT = 16


class Verdict(enum.Enum):
    DEAD_LETTER = "dead_letter"  # retrying cannot help, or the retry budget is spent
    RETRY = "retry"  # again after a backoff, spending one retry of the budget
    WAIT = "wait"  # another live worker holds the document: again once it is done, spending nothing


def verdict(error: BaseException, *, attempts: int, max_retries: int) -> Verdict:
    """What to do with work that failed with ``error`` on its ``attempts``-th attempt.

    A :class:`PermanentError` is dead-lettered at once; a :class:`DocumentBusyError` waits without
    spending the budget. Anything else counts as transient, ours or not (a soft time limit, a timeout, a
    bug): retried while the budget lasts, so a bug dead-letters after a few tries instead of vanishing.
    """
    if isinstance(error, PermanentError):
        return Verdict.DEAD_LETTER
    if isinstance(error, DocumentBusyError):
        return Verdict.WAIT
    return Verdict.RETRY if attempts <= max_retries else Verdict.DEAD_LETTER


@dataclass(frozen=True, slots=True)
class Settlement(Generic[T]):
    """The failed items of one message, sorted by verdict (each list in message order)."""

    dead: tuple[tuple[T, BaseException], ...] = ()
    retry: tuple[tuple[T, BaseException], ...] = ()
    wait: tuple[T, ...] = ()


def settle(failures: Iterable[tuple[T, BaseException]], *, attempts: int, max_retries: int) -> Settlement[T]:
    """Sort the items of a message that failed (each with its error) by :func:`verdict`: the dead ones
    are dead-lettered one by one, the ones to retry go together in one new message, the busy ones in
    another after a short wait."""
    sorted_: dict[Verdict, list[tuple[T, BaseException]]] = {v: [] for v in Verdict}
    for item, error in failures:
        sorted_[verdict(error, attempts=attempts, max_retries=max_retries)].append((item, error))
    return Settlement(dead=tuple(sorted_[Verdict.DEAD_LETTER]), retry=tuple(sorted_[Verdict.RETRY]),
                      wait=tuple(item for item, _ in sorted_[Verdict.WAIT]))


def retry_countdown(retries: int, *, cap_s: float = MAX_BACKOFF_S,
                    draw: Callable[[float, float], float] = random.uniform) -> float:
    """Seconds before retry number ``retries + 1``: exponential with full jitter, uniform in
    ``[0, min(cap_s, 2**retries)]``, so messages that failed together (a database restart) do not all come
    back in the same instant."""
    return draw(0.0, min(cap_s, 2.0 ** min(max(retries, 0), _MAX_EXPONENT)))
