"""What the ingest and embed stages ask a shard to apply, as plain data."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from shardfuse.pipeline.config.settings import DEFAULT_MODEL
from shardfuse.pipeline.core.documents import Chunk, TextBlock
from shardfuse.pipeline.core.events import WriteEvent


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
    # The default model's vectors, one per chunk; None when the zone's writes no longer fill that column.
    embeddings: npt.NDArray[np.float32] | None = field(default=None, compare=False)
    # Other models' vectors by model name (shardfuse.pipeline.index.store.embedding_columns): a zone being reindexed.
    # A plain dict: the benchmarks' loader processes receive changes by copy, which a mappingproxy refuses.
    model_embeddings: Mapping[str, npt.NDArray[np.float32]] = field(default_factory=dict, compare=False)
    line_count: int = 0
    reason: str | None = None
    # Chunks the entropy filter dropped, by reason; stored on the document row.
    dropped: dict[str, int] = field(default_factory=dict, compare=False)
    # Apply at the same seq too (a re-index of what the shard holds, e.g. backfill-context).
    refresh: bool = False
    # The fencing token of the writer's document lease (shardfuse.pipeline.coordination.leases); None: written without
    # a lease.
    fence: int | None = None
    # The document's text in blocks of lines for the grep index (shardfuse.pipeline.index.store.grep_blocks);
    # written with the chunks, in the same transaction. Empty: no grep blocks (an older release's message).
    blocks: tuple[TextBlock, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.status is DocStatus.INDEXED:
            vectors = [v for v in (self.embeddings, *self.model_embeddings.values()) if v is not None]
            if not vectors or any(len(v) != len(self.chunks) for v in vectors):
                raise ValueError("an indexed change needs one embedding per chunk")
        elif self.chunks or self.blocks:
            raise ValueError(f"a {self.status} change carries no chunks")

    @property
    def key(self) -> tuple[str, str]:
        return self.event.key

    @property
    def models(self) -> frozenset[str]:
        """The models this change carries vectors of."""
        return frozenset(self.model_embeddings) | ({DEFAULT_MODEL} if self.embeddings is not None else set())


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
    # The zone's writes must now fill these models' columns too, and the change has no vectors for them
    # (a reindex began after they were embedded): refused, to be embedded again.
    missing_models: tuple[str, ...] = ()
