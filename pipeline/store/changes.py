"""What the ingest and embed stages ask a shard to apply, as plain data."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pipeline.events import WriteEvent
from pipeline.models import Chunk


class DocStatus(enum.StrEnum):
    INDEXED = "indexed"
    SKIPPED = "skipped"
    DELETED = "deleted"


@dataclass(frozen=True, slots=True)
class DocumentChange:
    """The new state of one ``(zone, path)``: indexed with these chunks, skipped for a reason, or deleted
    (a tombstone that keeps the event's ``seq`` so a late write cannot resurrect the document)."""

    event: WriteEvent
    status: DocStatus
    chunks: tuple[Chunk, ...] = ()
    embeddings: npt.NDArray[np.float32] | None = field(default=None, compare=False)
    line_count: int = 0
    reason: str | None = None
    # Chunks the entropy filter dropped, by reason; stored on the document row.
    dropped: dict[str, int] = field(default_factory=dict, compare=False)
    # Apply at the same seq too (a re-index of what the shard holds, e.g. backfill-context).
    refresh: bool = False
    # The fencing token of the writer's document lease (pipeline.leases); None: written without a lease.
    fence: int | None = None

    def __post_init__(self) -> None:
        if self.status is DocStatus.INDEXED:
            if self.embeddings is None or len(self.embeddings) != len(self.chunks):
                raise ValueError("an indexed change needs one embedding per chunk")
        elif self.chunks:
            raise ValueError(f"a {self.status} change carries no chunks")

    @property
    def key(self) -> tuple[str, str]:
        return self.event.key


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    """Whether a change took effect. ``applied`` is False when the shard already held a newer or equal
    ``seq`` for the document (the event was stale): that is success, not an error. ``fenced`` is True when
    the shard refused the change because it had seen a newer lease's token (``stored_fence``): the writer
    lost its lease and must retry under a new one."""

    key: tuple[str, str]
    seq: int
    applied: bool
    stored_seq: int | None
    fenced: bool = False
    stored_fence: int = 0
