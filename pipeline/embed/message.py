"""One message of chunked documents through the embed stage: each document leased (the message's leases
taken in one round trip and given back in one), handed to the process's batcher (which embeds it with other
messages' documents and writes it to its shard), and waited for until a deadline.

Nothing here settles a failure: each document that failed is returned with its error, and the caller
decides between retry, wait and dead letter.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from shardfuse.pipeline.coordination.lease_holding import Leases, busy_error
from shardfuse.pipeline.coordination.leases import Busy, Lease
from shardfuse.pipeline.core.documents import PreparedDocument
from shardfuse.pipeline.core.errors import LeaseLostError, TransientError
from shardfuse.pipeline.index.store import ApplyOutcome

DocKey = tuple[str, str]
Failure = tuple[Any, BaseException]
# What wraps the work on one document (the worker sets the document's log context there).
AroundDocument = Callable[[Any], AbstractContextManager[object]]


class DocumentBatcher(Protocol):
    """:class:`~shardfuse.pipeline.embed.batcher.EmbedBatcher`: embeds and writes submitted documents."""

    def submit(self, document: PreparedDocument, *, fence: int | None = None) -> Future[ApplyOutcome]: ...


@dataclass(frozen=True, slots=True)
class EmbeddedMessage:
    """What one message of documents came to.

    ``indexed``: documents written to their shard; ``stale``: documents the shard already held at this seq
    or a newer one. ``committed``: per shard, the documents written there *or already there* (a redelivered
    copy of a message whose commit landed before its worker died or its BM25 bookkeeping failed), whose
    shard's BM25 update is due: scheduling it again is cheap, and the update finds in PostgreSQL whatever
    the lost bookkeeping would have recorded. ``failures``: each document that failed (as received) with
    its error.
    """

    indexed: int = 0
    stale: int = 0
    committed: Mapping[int, tuple[DocKey, ...]] = field(default_factory=dict)
    failures: tuple[Failure, ...] = ()


@dataclass(frozen=True, slots=True)
class _Pending:
    raw: Any
    document: PreparedDocument
    lease: Lease
    future: Future[ApplyOutcome]


def embed_message(
    raw_documents: Sequence[Any],
    *,
    leases: Leases,
    batcher: DocumentBatcher,
    wait_s: float,
    shards: int | None = None,
    around: AroundDocument | None = None,
) -> EmbeddedMessage:
    """Index the documents of one message. Every document goes to the batcher at once, so one message's
    documents share provider requests and shard transactions with each other and with other messages'.
    Each is held under its document lease, whose fencing token the shard checks at the write; all of them
    are waited for at most ``wait_s`` seconds in all (a document not committed by then fails with a
    :class:`TransientError`). A document that is not one, or that names a shard its path does not belong to
    among ``shards``, fails alone with a permanent :class:`InvalidEventError`.
    """
    failures: list[Failure] = []
    parsed: list[tuple[Any, PreparedDocument]] = []
    for raw in raw_documents:
        try:
            with _around(around, raw):
                parsed.append((raw, PreparedDocument.from_dict(raw, shards=shards)))
        except Exception as exc:  # noqa: BLE001 - a malformed document fails alone
            failures.append((raw, exc))
    try:
        taken = leases.acquire_many([document.event.key for _, document in parsed])
    except Exception as exc:  # noqa: BLE001 - Redis out of reach: every document fails with it; retried
        return EmbeddedMessage(failures=(*failures, *((raw, exc) for raw, _ in parsed)))
    pending: list[_Pending] = []
    for (raw, document), lease in zip(parsed, taken, strict=True):
        if isinstance(lease, Busy):
            failures.append((raw, busy_error(lease)))
        else:
            pending.append(_Pending(raw, document, lease, batcher.submit(document, fence=lease.token)))
    deadline = time.monotonic() + wait_s
    indexed = stale = 0
    committed: dict[int, list[DocKey]] = {}
    try:
        for item in pending:
            try:
                with _around(around, item.raw):
                    outcome = _committed(item, leases, deadline=deadline, wait_s=wait_s)
            except Exception as exc:  # noqa: BLE001 - a failed document fails alone; the caller settles it
                failures.append((item.raw, exc))
                continue
            if outcome.applied:
                indexed += 1
            else:
                stale += 1
            committed.setdefault(item.document.shard, []).append(item.document.event.key)
    finally:
        # After a timeout the batcher may still write a document: its token then loses to the retry's
        # newer one, or the retry finds the seq already applied.
        leases.release_many([item.lease for item in pending])
    return EmbeddedMessage(indexed=indexed, stale=stale, failures=tuple(failures),
                           committed={shard: tuple(keys) for shard, keys in committed.items()})


def _around(around: AroundDocument | None, raw: Any) -> AbstractContextManager[object]:
    return contextlib.nullcontext() if around is None else around(raw)


def _committed(item: _Pending, leases: Leases, *, deadline: float, wait_s: float) -> ApplyOutcome:
    """The document's outcome once its shard transaction committed."""
    try:
        outcome = item.future.result(timeout=max(0.0, deadline - time.monotonic()))
    except FutureTimeout as exc:
        raise TransientError(f"not written to shard {item.document.shard} within {wait_s:.0f}s") from exc
    if outcome.fenced:
        leases.raise_floor(outcome.stored_fence)
        raise LeaseLostError.fenced(stored_fence=outcome.stored_fence, carried=item.lease.token)
    return outcome
