"""Working on a document under its lease: busy while another live worker holds it, and the fencing
counter raised when a shard refused our token (:mod:`shardfuse.pipeline.coordination.leases`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

from shardfuse.pipeline.coordination.leases import Lease
from shardfuse.pipeline.core.errors import DocumentBusyError, LeaseLostError


class Leases(Protocol):
    """The document leases of one process (:class:`~shardfuse.pipeline.coordination.leases.DocumentLeases`)."""

    def acquire(self, zone: str, path: str) -> Lease | None: ...

    def holder_of(self, zone: str, path: str) -> str | None: ...

    def release(self, lease: Lease) -> bool: ...

    def raise_floor(self, token: int) -> int: ...


def take_lease(leases: Leases, zone: str, path: str) -> Lease:
    """The document's lease, or :class:`DocumentBusyError` while another live worker holds it."""
    lease = leases.acquire(zone, path)
    if lease is None:
        raise DocumentBusyError(f"[{zone}] {path} is being worked on by {leases.holder_of(zone, path)}")
    return lease


@contextlib.contextmanager
def leased(leases: Leases, zone: str, path: str) -> Iterator[Lease]:
    """Hold the document's lease while the block runs; :class:`DocumentBusyError` if another live worker
    holds it. A :class:`LeaseLostError` from the block raises the token counter past the shard's, so the
    retry's new lease outranks the token the shard holds."""
    lease = take_lease(leases, zone, path)
    try:
        yield lease
    except LeaseLostError as exc:
        leases.raise_floor(exc.stored_fence)
        raise
    finally:
        leases.release(lease)
