"""The results of symbol extraction, and what every language's extractor shares."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
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
class ChunkSymbols:
    """What one chunk defines. Empty (no symbols, no role) for prose and for code that defines nothing."""

    symbols: tuple[str, ...] = ()
    primary_symbol: str | None = None
    role: Role | None = None

    def to_json(self) -> dict[str, Any] | None:
        """The stored and transported form, ``{"symbols", "primary", "role"}``; None when empty."""
        if not self.symbols and self.role is None:
            return None
        return {
            "symbols": list(self.symbols),
            "primary": self.primary_symbol,
            "role": None if self.role is None else self.role.value,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> ChunkSymbols:
        """Inverse of :meth:`to_json`; an unknown role reads as None rather than failing a search."""
        if not data:
            return NO_SYMBOLS
        primary = data.get("primary")
        return cls(
            symbols=tuple(str(s) for s in data.get("symbols") or ()),
            primary_symbol=None if primary is None else str(primary),
            role=_ROLES.get(str(data.get("role"))),
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
    )
