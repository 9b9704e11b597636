"""The results of symbol extraction, and what every language's extractor shares."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class Role(enum.StrEnum):
    COMPLETE = "complete"  # the chunk holds a whole definition, header to end
    DECLARATION = "declaration"  # its header/signature, but not its end
    BODY = "body"  # no header: it continues a definition begun in an earlier chunk
    MIXED = "mixed"  # several whole definitions, or definitions with other code (the code chunker merges small ones)


class Language(enum.StrEnum):
    PYTHON = "python"
    JAVASCRIPT = "javascript"
    TYPESCRIPT = "typescript"
    GO = "go"
    RUST = "rust"
    JAVA = "java"
    KOTLIN = "kotlin"
    CSHARP = "csharp"
    C = "c"
    CPP = "cpp"


_ROLES = {role.value: role for role in Role}


@dataclass(frozen=True, slots=True)
class SymbolLines:
    """Where one definition is in its chunk: its header's line and its last line, 0-based from the chunk's
    first line (add the chunk's ``start_line``). A definition that goes on past the chunk ends on the
    chunk's last line; its header is where its pattern starts (a Python decorator is not part of it)."""

    name: str
    first: int
    last: int


@dataclass(frozen=True, slots=True)
class ChunkSymbols:
    """What one chunk defines. Empty (no symbols, no role) for prose and for code that defines nothing.
    ``lines`` holds each definition's lines in the chunk, in order (a name defined twice appears twice);
    empty for chunks stored before it existed, which then have no per-symbol range. It is left out of ``==``:
    two readers that find the same definitions agree, whether or not one of them reads lines."""

    symbols: tuple[str, ...] = ()
    primary_symbol: str | None = None
    role: Role | None = None
    lines: tuple[SymbolLines, ...] = field(default=(), compare=False)

    def lines_of(self, name: str) -> SymbolLines | None:
        """The first definition of ``name`` in the chunk, or None when the chunk has no lines for it."""
        return next((entry for entry in self.lines if entry.name == name), None)

    def to_json(self) -> dict[str, Any] | None:
        """The stored and transported form, ``{"symbols", "primary", "role", "lines"}`` (``lines``:
        ``[[name, first, last], ...]``, left out when there are none); None when empty."""
        if not self.symbols and self.role is None:
            return None
        data: dict[str, Any] = {
            "symbols": list(self.symbols),
            "primary": self.primary_symbol,
            "role": None if self.role is None else self.role.value,
        }
        if self.lines:
            data["lines"] = [[entry.name, entry.first, entry.last] for entry in self.lines]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> ChunkSymbols:
        """Inverse of :meth:`to_json`; an unknown role reads as None and a malformed ``lines`` entry is left out,
        rather than failing a search."""
        if not data:
            return NO_SYMBOLS
        primary = data.get("primary")
        return cls(
            symbols=tuple(str(s) for s in data.get("symbols") or ()),
            primary_symbol=None if primary is None else str(primary),
            role=_ROLES.get(str(data.get("role"))),
            lines=_read_lines(data.get("lines")),
        )


def _read_lines(data: object) -> tuple[SymbolLines, ...]:
    """``[[name, first, last], ...]`` as :class:`SymbolLines`; entries of any other shape are skipped."""
    if not isinstance(data, list):
        return ()
    return tuple(
        SymbolLines(entry[0], entry[1], entry[2])
        for entry in data
        if isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
        and all(type(n) is int and n >= 0 for n in entry[1:]) and entry[1] <= entry[2]
    )


NO_SYMBOLS = ChunkSymbols()


class Kind(enum.Enum):
    CALLABLE = "callable"
    TYPE = "type"
    CONSTANT = "constant"  # a symbol, but the primary only when the chunk defines nothing else


@dataclass(frozen=True, slots=True)
class Definition:
    name: str
    kind: Kind
    nested: bool  # inside another definition whose header is in this chunk
    closed: bool  # its end is inside the chunk
    # Its header's line and its last line in the chunk, 0-based (the chunk's last line when not closed).
    lines: tuple[int, int] | None = None


class Extractor(Protocol):
    def extract(self, text: str, *, starts_mid_line: bool, ends_document: bool) -> ChunkSymbols: ...


def summarise(definitions: list[Definition], *, continues: bool, ends_document: bool) -> ChunkSymbols:
    outer = [d for d in definitions if not d.nested]
    if not outer:
        return ChunkSymbols(role=Role.BODY) if continues else NO_SYMBOLS
    primary = next((d for d in outer if d.kind is not Kind.CONSTANT), outer[0])
    return ChunkSymbols(
        symbols=tuple(dict.fromkeys(d.name for d in definitions)),
        primary_symbol=primary.name,
        role=Role.COMPLETE if primary.closed or ends_document else Role.DECLARATION,
        lines=tuple(SymbolLines(d.name, *d.lines) for d in definitions if d.lines is not None),
    )
