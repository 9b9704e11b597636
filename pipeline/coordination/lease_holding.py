"""Working on documents under their leases: busy while another live worker holds one, and the fencing
counter raised when a shard refused our token (:mod:`shardfuse.pipeline.coordination.leases`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Protocol

from shardfuse.pipeline.coordination.leases import Busy, Lease
from shardfuse.pipeline.core.errors import DocumentBusyError, LeaseLostError

DocKey = tuple[str, str]


class Leases(Protocol):
    """The document leases of one process (:class:`~shardfuse.pipeline.coordination.leases.DocumentLeases`)."""

    def acquire(self, zone: str, path: str) -> Lease | None: ...

    def acquire_many(self, documents: Sequence[DocKey]) -> list[Lease | Busy]: ...

    def holder_of(self, zone: str, path: str) -> str | None: ...

    def release(self, lease: Lease) -> bool: ...

    def release_many(self, leases: Sequence[Lease]) -> int: ...

    def raise_floor(self, token: int) -> int: ...


def busy_error(busy: Busy) -> DocumentBusyError:
    return DocumentBusyError(f"[{busy.zone}] {busy.path} is being worked on by {busy.holder}")


def take_lease(leases: Leases, zone: str, path: str) -> Lease:
    """The document's lease, or :class:`DocumentBusyError` while another live worker holds it."""
    lease = leases.acquire(zone, path)
    if lease is None:
        raise DocumentBusyError(f"[{zone}] {path} is being worked on by {leases.holder_of(zone, path)}")
    return lease


class MessageLeases:
    """The leases of one message's documents: taken together in one round trip when the message starts, and
    given back together when it ends (two round trips a message, not two a document).

    A document still being worked on when the message ends (its thread given up on,
    :mod:`shardfuse.pipeline.ingest.document_threads`) keeps its lease: its thread gives it back when its work
    returns (:meth:`finish`), so no other run of the document starts while it may still write.
    :class:`~shardfuse.pipeline.core.errors.StoreUnavailableError` from the constructor when Redis is out of
    reach.
    """

    def __init__(self, leases: Leases, documents: Sequence[DocKey]) -> None:
        self._leases = leases
        self._current: dict[DocKey, Lease | Busy | None] = dict(
            zip(documents, leases.acquire_many(documents), strict=True))
        self._finished: list[Lease] = []
        self._closed = False
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def held(self, zone: str, path: str) -> Iterator[Lease]:
        """The document's lease while the block (one event's work) runs; :class:`DocumentBusyError` if another
        live worker holds it. A :class:`LeaseLostError` from the block raises the token counter past the
        shard's and gives the fenced lease back: the document's next event, or the retry, takes a new one
        that outranks the token the shard holds."""
        key = (zone, path)
        lease = self._current[key]
        if isinstance(lease, Busy):
            raise busy_error(lease)
        if lease is None:  # the last one was fenced
            lease = self._current[key] = take_lease(self._leases, zone, path)
        try:
            yield lease
        except LeaseLostError as exc:
            self._current[key] = None
            self._leases.raise_floor(exc.stored_fence)
            self._leases.release(lease)
            raise

    def finish(self, key: DocKey) -> None:
        """The work on the document is over: its lease goes back with the others at :meth:`close`, or now if
        the message has already ended."""
        lease = self._current.get(key)
        if not isinstance(lease, Lease):
            return
        with self._lock:
            if not self._closed:
                self._finished.append(lease)
                return
        self._leases.release(lease)

    def close(self) -> None:
        """The message is done: every finished document's lease goes back, in one round trip."""
        with self._lock:
            self._closed = True
            finished, self._finished = self._finished, []
        self._leases.release_many(finished)
