"""Turn stored bytes into text, or say plainly why they cannot be indexed.

Accepted: UTF-8 with or without a byte-order mark, and UTF-16/UTF-32 with a byte-order mark. Nothing else
is guessed at: a wrong guess indexes garbage, while a :class:`Skipped` reason tells a person what to fix.

The text is kept exactly as stored (CRLF stays CRLF) so that character offsets and line numbers map to
the real file. Lines are counted by ``"\\n"`` alone; a lone ``"\\r"`` does not end a line.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

# Binary-detection heuristics look at the start of the content, as git and file(1) do.
SNIFF_CHARS = 8 * 1024
# More than this share of control characters in the sniffed prefix means binary content.
MAX_CONTROL_SHARE = 0.10
# Control characters that text legitimately holds: tab, LF, VT, FF, CR, and ESC (ANSI colours in logs).
_TEXT_CONTROLS = frozenset("\t\n\x0b\x0c\r\x1b")
_CONTROLS = "".join(chr(c) for c in (*range(0x20), 0x7F) if chr(c) not in _TEXT_CONTROLS)
_DROP_CONTROL_BYTES = _CONTROLS.encode("ascii")
_DROP_CONTROL_CHARS = str.maketrans("", "", _CONTROLS)

# Longest BOMs first: the UTF-32-LE mark begins with the UTF-16-LE one.
_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


@dataclass(frozen=True, slots=True)
class Decoded:
    """Decodable text. ``encoding`` is the codec used; ``bom`` says whether a byte-order mark was
    stripped (offsets index ``text``, which starts after it)."""

    text: str
    encoding: str
    bom: bool

    @property
    def line_count(self) -> int:
        """Lines in the text, counting ``"\\n"``: ``"a\\nb"`` and ``"a\\nb\\n"`` both have 2."""
        if not self.text:
            return 0
        return self.text.count("\n") + (not self.text.endswith("\n"))


@dataclass(frozen=True, slots=True)
class Skipped:
    """Content that will not be indexed, with a reason a person can act on."""

    reason: str


def decode_content(data: bytes, *, max_bytes: int) -> Decoded | Skipped:
    """Decode ``data`` as text, or return :class:`Skipped` when it is too large, empty, binary or not
    in a supported encoding."""
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    if len(data) > max_bytes:
        return too_large(len(data), max_bytes=max_bytes)
    if not data:
        return Skipped("empty file")
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return _decode_with_bom(data, bom=bom, encoding=encoding)
    return _decode_utf8(data)


def too_large(size: int, *, max_bytes: int) -> Skipped:
    """The skip of content over ``limits.max_file_bytes`` (the ingest stage asks before reading it)."""
    return Skipped(f"too large: {size:,} bytes > limit {max_bytes:,}")


def _decode_utf8(data: bytes) -> Decoded | Skipped:
    # Check for binary before decoding: most binary files are also invalid UTF-8, and "binary" is the
    # more useful reason.
    nul = data.find(b"\x00")
    if nul != -1:
        return Skipped(f"binary content (NUL byte at offset {nul:,})")
    sample = data[:SNIFF_CHARS]
    controls = len(sample) - len(sample.translate(None, _DROP_CONTROL_BYTES))
    if controls > MAX_CONTROL_SHARE * len(sample):
        return _too_many_controls(controls, len(sample), unit="bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Skipped(f"not valid UTF-8 (invalid byte 0x{data[exc.start]:02x} at offset {exc.start:,})")
    return Decoded(text=text, encoding="utf-8", bom=False)


def _decode_with_bom(data: bytes, *, bom: bytes, encoding: str) -> Decoded | Skipped:
    try:
        text = data[len(bom) :].decode(encoding)
    except UnicodeDecodeError as exc:
        offset = len(bom) + exc.start
        return Skipped(
            f"not valid {encoding.upper()} despite its byte-order mark "
            f"({exc.reason} at byte offset {offset:,})"
        )
    if not text:
        return Skipped("empty file (only a byte-order mark)")
    # PostgreSQL text cannot hold NUL, and NUL-laden text is binary in all but name.
    nul = text.find("\x00")
    if nul != -1:
        return Skipped(f"binary content (NUL character at character {nul:,} after the {encoding} BOM)")
    sample = text[:SNIFF_CHARS]
    controls = len(sample) - len(sample.translate(_DROP_CONTROL_CHARS))
    if controls > MAX_CONTROL_SHARE * len(sample):
        return _too_many_controls(controls, len(sample), unit="characters")
    return Decoded(text=text, encoding=encoding, bom=True)


def _too_many_controls(controls: int, sampled: int, *, unit: str) -> Skipped:
    return Skipped(
        f"binary content ({controls:,} of the first {sampled:,} {unit} are control characters, "
        f"more than {MAX_CONTROL_SHARE:.0%})"
    )
