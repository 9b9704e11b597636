"""Token-aware packing of embedding inputs into provider requests, and mapping the answers back.

Pure functions over plain data: no provider, no clock, no I/O.

A provider limits a request twice: by its number of inputs and by its total tokens. :func:`pack` cuts a
sequence of items (chunks of several documents) into batches that respect both, and :func:`unpack` maps the
vectors of each batch back to the items' keys.

Packing is sequential ("next-fit"): items are taken in input order and each goes into the batch being
filled, or starts a new batch when it would break a limit; an earlier batch is never reopened. So every
batch is a contiguous run of the input. That can cost a few more requests than a bin-packing that fills
gaps with later small items (at most twice the optimum, usually one or two more), but it keeps a
document's chunks together: a failed request affects the few documents whose chunks it held, instead of
a scatter of documents across every request.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from shardfuse.pipeline.embed.providers.base import Vectors

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class PackItem(Generic[K]):
    """One input to embed: its ``key`` (e.g. ``(document key, chunk ordinal)``) and its token count."""

    key: K
    tokens: int


@dataclass(frozen=True, slots=True)
class PackLimits:
    """A provider's per-request limits: at most ``max_inputs`` inputs and ``max_tokens`` tokens in all."""

    max_inputs: int
    max_tokens: int

    def __post_init__(self) -> None:
        if self.max_inputs < 1:
            raise ValueError(f"max_inputs must be at least 1, got {self.max_inputs}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")


@dataclass(frozen=True, slots=True)
class Batch(Generic[K]):
    """One request's inputs: the items at ``start .. start + len(keys) - 1`` of the packed sequence."""

    keys: tuple[K, ...]
    start: int
    tokens: int

    def __len__(self) -> int:
        return len(self.keys)


def pack(items: Sequence[PackItem[K]], limits: PackLimits) -> list[Batch[K]]:
    """Cut ``items`` into batches within ``limits``, every item exactly once, in input order.

    Raises :class:`ValueError` for a negative token count, a key given twice (the answers could not be
    mapped back), or an item that alone exceeds ``limits.max_tokens`` (no request could hold it: inputs
    over the provider's per-input limit must be truncated or split before packing).
    """
    seen: set[K] = set()
    for position, item in enumerate(items):
        if item.tokens < 0:
            raise ValueError(f"item {position} ({item.key!r}) has a negative token count: {item.tokens}")
        if item.tokens > limits.max_tokens:
            raise ValueError(
                f"item {position} ({item.key!r}) has {item.tokens} tokens, more than a whole request may hold "
                f"({limits.max_tokens}); truncate or split it before packing"
            )
        if item.key in seen:
            raise ValueError(f"item {position} repeats the key {item.key!r}; keys must be unique")
        seen.add(item.key)

    batches: list[Batch[K]] = []
    start = 0
    tokens = 0
    for position, item in enumerate(items):
        size = position - start
        if size and (size == limits.max_inputs or tokens + item.tokens > limits.max_tokens):
            batches.append(_batch(items, start, position, tokens))
            start, tokens = position, 0
        tokens += item.tokens
    if start < len(items):
        batches.append(_batch(items, start, len(items), tokens))
    return batches


def _batch(items: Sequence[PackItem[K]], start: int, stop: int, tokens: int) -> Batch[K]:
    return Batch(keys=tuple(item.key for item in items[start:stop]), start=start, tokens=tokens)


def unpack(batches: Sequence[Batch[K]], vectors_per_batch: Sequence[Vectors]) -> dict[K, Vectors]:
    """Map each batch's vectors (one row per input, in the batch's order) back to the items' keys.

    Raises :class:`ValueError` when the number of answers differs from the number of batches, or when a
    batch got a different number of vectors than it had inputs: a provider that dropped or added a row
    would otherwise shift every later vector onto the wrong chunk.
    """
    if len(batches) != len(vectors_per_batch):
        raise ValueError(f"{len(batches)} batches but {len(vectors_per_batch)} answers")
    out: dict[K, Vectors] = {}
    for number, (batch, vectors) in enumerate(zip(batches, vectors_per_batch, strict=True)):
        if len(vectors) != len(batch):
            raise ValueError(
                f"batch {number} (items {batch.start}..{batch.start + len(batch) - 1}) sent {len(batch)} inputs "
                f"but got {len(vectors)} vectors back"
            )
        for key, vector in zip(batch.keys, vectors, strict=True):
            out[key] = vector
    return out
