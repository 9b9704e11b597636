"""Checks on untrusted text shared by every validated message (write events, search requests): what
PostgreSQL's ``text`` cannot hold, and how an error message quotes a bad value."""

from __future__ import annotations

# How much of a bad value an error message quotes.
_QUOTE_CHARS = 80


def quoted(value: object, limit: int = _QUOTE_CHARS) -> str:
    """``repr(value)``, cut to ``limit`` characters, so that a 10 MB bad value makes a short message."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 1]}… ({len(text):,} characters)"


def bad_character(text: str) -> str | None:
    """What in ``text`` PostgreSQL's ``text`` cannot hold (a NUL, a lone surrogate), or None."""
    nul = text.find("\x00")
    if nul != -1:
        return f"a NUL character at index {nul}"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"a lone surrogate U+{ord(text[exc.start]):04X} at index {exc.start}, which is not valid Unicode"
    return None
