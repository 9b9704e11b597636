"""Plain immutable data passed between stages. Everything here round-trips through JSON, because it
travels in Celery messages (JSON serializer only)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from typing import Any

from pipeline.events import WriteEvent
from pipeline.symbols import NO_SYMBOLS, ChunkSymbols


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of a document's text, with where it came from.

    ``start_char``/``end_char`` index the decoded text (``text == doc[start_char:end_char]``);
    ``start_line``/``end_line`` are 1-based and inclusive. ``symbols`` is what the chunk defines when the
    document is code (set at ingest, :mod:`pipeline.symbols`), empty otherwise.
    """

    ordinal: int
    text: str
    start_char: int
    end_char: int
    start_line: int
    end_line: int
    token_count: int
    symbols: ChunkSymbols = NO_SYMBOLS

    @property
    def chunk_hash(self) -> str:
        return "sha256:" + hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "symbols"}
        data["symbols"] = self.symbols.to_json()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Chunk:
        """Inverse of :meth:`to_dict`; a message without ``symbols`` (sent before they existed) reads
        as a chunk that defines nothing."""
        values = dict(data)
        symbols = ChunkSymbols.from_json(values.pop("symbols", None))
        return cls(**values, symbols=symbols)


def chunk_id(zone: str, path: str, seq: int, ordinal: int) -> str:
    """A chunk's id: deterministic, so a task that runs twice writes the same rows."""
    digest = hashlib.sha256(f"{zone}\x00{path}\x00{seq}\x00{ordinal}".encode()).hexdigest()
    return digest[:32]


@dataclass(frozen=True, slots=True)
class PreparedDocument:
    """A decoded, chunked document on its way from the ingest stage to the embed stage."""

    event: WriteEvent
    shard: int
    chunks: tuple[Chunk, ...]
    line_count: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": self.event.model_dump(mode="json"),
            "shard": self.shard,
            "chunks": [c.to_dict() for c in self.chunks],
            "line_count": self.line_count,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PreparedDocument:
        return cls(
            event=WriteEvent.model_validate(data["event"]),
            shard=int(data["shard"]),
            chunks=tuple(Chunk.from_dict(c) for c in data["chunks"]),
            line_count=int(data["line_count"]),
        )
