"""Plain immutable data passed between stages. Everything here round-trips through JSON, because it
travels in Celery messages (JSON serializer only)."""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, TypeGuard

from shardfuse.pipeline.core.errors import InvalidEventError
from shardfuse.pipeline.core.events import WriteEvent
from shardfuse.pipeline.core.sharding import shard_for
from shardfuse.pipeline.ingest.symbols import NO_SYMBOLS, ChunkSymbols


class ContextSource(enum.StrEnum):
    """Where a chunk's situating context came from."""

    HEADINGS = "headings"  # title, heading path, symbol and file path: free and deterministic
    LLM = "llm"  # written by the chat model
    BACKFILL = "backfill"  # the LLM failed or the run's budget ran out: headings for now, LLM later


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of a document's text, with where it came from.

    ``start_char``/``end_char`` index the decoded text (``text == doc[start_char:end_char]``);
    ``start_line``/``end_line`` are 1-based and inclusive. ``symbols`` is what the chunk defines when the
    document is code (set at ingest, :mod:`shardfuse.pipeline.ingest.symbols`), empty otherwise; ``language`` is the
    code's
    language. ``heading_path`` is where the chunk sits in the document's outline. ``context`` situates the
    chunk in its document (Contextual Retrieval): it is embedded and BM25-indexed with the chunk
    (:attr:`indexed_text`) while search returns ``text`` alone.
    """

    ordinal: int
    text: str
    start_char: int
    end_char: int
    start_line: int
    end_line: int
    token_count: int
    symbols: ChunkSymbols = NO_SYMBOLS
    language: str | None = None
    heading_path: tuple[str, ...] = ()
    context: str = ""
    context_source: ContextSource | None = None

    @property
    def chunk_hash(self) -> str:
        """The chunk's own text, hashed: what the LLM context cache is keyed by."""
        return "sha256:" + hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @property
    def indexed_text(self) -> str:
        """What is embedded and what BM25 indexes: the context, then the chunk."""
        return f"{self.context}\n\n{self.text}" if self.context else self.text

    @property
    def embedding_key(self) -> str:
        """The hash of :attr:`indexed_text`: what the embedding cache is keyed by (a chunk without context
        keys as its own text, so vectors cached before contexts existed stay valid)."""
        if not self.context:
            return self.chunk_hash
        return "sha256:" + hashlib.sha256(self.indexed_text.encode("utf-8")).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["symbols"] = self.symbols.to_json()
        data["heading_path"] = list(self.heading_path)
        data["context_source"] = None if self.context_source is None else self.context_source.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Chunk:
        """Inverse of :meth:`to_dict`; fields a message sent by an older release lacks take their
        defaults (no symbols, no context)."""
        values = dict(data)
        symbols = ChunkSymbols.from_json(values.pop("symbols", None))
        heading_path = tuple(str(h) for h in values.pop("heading_path", None) or ())
        source = values.pop("context_source", None)
        return cls(**values, symbols=symbols, heading_path=heading_path,
                   context_source=None if source is None else ContextSource(source))


def chunk_id(zone: str, path: str, seq: int, ordinal: int) -> str:
    """A chunk's id: deterministic, so a task that runs twice writes the same rows."""
    digest = hashlib.sha256(f"{zone}\x00{path}\x00{seq}\x00{ordinal}".encode()).hexdigest()
    return digest[:32]


@dataclass(frozen=True, slots=True)
class TextBlock:
    """Whole lines of a document's decoded text, from line ``start_line`` (1-based) on, joined by ``"\\n"``:
    what the grep index holds (:mod:`shardfuse.pipeline.index.store.grep_blocks`)."""

    start_line: int
    text: str


@dataclass(frozen=True, slots=True)
class PreparedDocument:
    """A decoded, chunked document on its way from the ingest stage to the embed stage."""

    event: WriteEvent
    shard: int
    chunks: tuple[Chunk, ...]
    line_count: int
    # Chunks the entropy filter dropped, by reason (shardfuse.pipeline.ingest.chunk_filter.DropReason values).
    dropped: dict[str, int] = field(default_factory=dict)
    # Re-index at the same seq (backfill-context): replaces what the shard holds for that seq.
    refresh: bool = False
    # The whole text in blocks of lines, for the grep index; empty in a message from an older release (the
    # document is then written without grep blocks until it is indexed again).
    blocks: tuple[TextBlock, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The document as JSON for the embed message. A chunk whose text is its ``start_char:end_char`` slice
        of the document's text goes without ``"text"`` (:meth:`from_dict` takes it from the blocks): each
        chunk's text would otherwise travel twice, and encoding, checking and decoding the message cost in
        proportion to its bytes. The blocks drop the document's final newline; ``"final_newline"`` puts it
        back when a chunk ends on it. Any other chunk carries its text."""
        full = _whole_text(self.blocks)
        final_newline = full is not None and _ends_on_final_newline(self.chunks, full)
        data = {
            "event": self.event.model_dump(mode="json"),
            "shard": self.shard,
            "chunks": _chunk_dicts(self.chunks, full + "\n" if full is not None and final_newline else full),
            "line_count": self.line_count,
            "dropped": dict(self.dropped),
            "refresh": self.refresh,
            "blocks": [[b.start_line, b.text] for b in self.blocks],
        }
        if final_newline:  # only then: a message without it reads as before
            data["final_newline"] = True
        return data

    @classmethod
    def from_dict(cls, data: Any, *, shards: int | None = None) -> PreparedDocument:
        """Inverse of :meth:`to_dict`. :class:`InvalidEventError` (permanent: the same message fails the same
        way every time) for anything that is not a document of this form, or, given ``shards``, one placed on
        a shard its path does not belong to."""
        try:
            event = WriteEvent.model_validate(data["event"])
            blocks = tuple(_block(b) for b in data.get("blocks") or ())
            document = cls(
                event=event,
                shard=int(data["shard"]),
                chunks=_chunks_of(data["chunks"], blocks, final_newline=bool(data.get("final_newline", False))),
                line_count=int(data["line_count"]),
                dropped={str(k): int(v) for k, v in (data.get("dropped") or {}).items()},
                refresh=bool(data.get("refresh", False)),
                blocks=blocks,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # pydantic's ValidationError included
            raise InvalidEventError(f"malformed embed document: {type(exc).__name__}: {exc}"[:2000]) from exc
        if shards is not None:
            expected = shard_for(document.event.zone, document.event.path, shards)
            if document.shard != expected:
                raise InvalidEventError(f"embed document for {document.event.zone}/{document.event.path} names "
                                        f"shard {document.shard}; its path belongs on shard {expected} of {shards}")
        return document


def _block(raw: Any) -> TextBlock:
    """One ``[start_line, text]`` pair of :meth:`PreparedDocument.to_dict`'s ``blocks``."""
    start_line, text = raw
    if not isinstance(text, str) or int(start_line) < 1:
        raise ValueError(f"a text block is [start_line >= 1, text], got {str(raw)[:80]}")
    return TextBlock(start_line=int(start_line), text=text)


def _whole_text(blocks: Sequence[TextBlock]) -> str | None:
    """The decoded text ``blocks`` hold (without a final newline), or None when there are none or they are
    not each line once, in order, from line 1 (a chunk's text is then not known to be a slice of it)."""
    line = 1
    for block in blocks:
        if block.start_line != line:
            return None
        line += block.text.count("\n") + 1
    return "\n".join(block.text for block in blocks) if blocks else None


def _ends_on_final_newline(chunks: Sequence[Chunk], full: str) -> bool:
    """Whether a chunk's text runs one newline past ``full`` (the blocks' text): the document ended with it."""
    after = len(full) + 1
    return any(c.end_char == after and c.text == full[c.start_char:] + "\n" for c in chunks)


def _chunk_dicts(chunks: Sequence[Chunk], full: str | None) -> list[dict[str, Any]]:
    """Each chunk's :meth:`Chunk.to_dict`, without ``"text"`` where ``full`` holds the text at its offsets."""
    out = []
    for chunk in chunks:
        data = chunk.to_dict()
        start, end = chunk.start_char, chunk.end_char
        if full is not None and 0 <= start <= end <= len(full) and full[start:end] == chunk.text:
            del data["text"]
        out.append(data)
    return out


def _chunks_of(raw: Any, blocks: Sequence[TextBlock], *, final_newline: bool = False) -> tuple[Chunk, ...]:
    """The chunks of a message's document; a chunk without ``"text"`` takes its offsets' slice of the text
    the blocks hold, with the final newline when the message says the document had one
    (:meth:`PreparedDocument.to_dict`), checked first."""
    full: str | None = None
    chunks = []
    for i, data in enumerate(raw):
        if isinstance(data, dict) and "text" not in data:
            if full is None:
                full = _whole_text(blocks)
                if full is not None and final_newline:
                    full += "\n"
            data = {**data, "text": _slice_for(data, i, full)}
        chunks.append(Chunk.from_dict(data))
    return tuple(chunks)


def _slice_for(data: dict[str, Any], index: int, full: str | None) -> str:
    """``full[start_char:end_char]`` for a chunk sent without its text, or :class:`InvalidEventError`."""
    name = f"chunk {index} (ordinal {str(data.get('ordinal'))[:20]})"
    if full is None:
        raise InvalidEventError(f"malformed embed document: {name} has no text and the document no blocks "
                                "of its whole text to take it from")
    start, end = data.get("start_char"), data.get("end_char")
    if not (_is_int(start) and _is_int(end) and 0 <= start <= end <= len(full)):
        raise InvalidEventError(f"malformed embed document: {name} has no text and its offsets "
                                f"{str(start)[:20]}:{str(end)[:20]} are not a slice of the document's "
                                f"{len(full)} characters")
    return full[start:end]


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
