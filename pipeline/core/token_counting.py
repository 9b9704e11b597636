"""Token counting with tiktoken, and the token-to-character offsets that chunking needs.

The encoding is built from its BPE file on disk when one is found (``chunking.bpe_dir``, else the checkout's
``.cache/tiktoken``: :mod:`shardfuse.pipeline.core.bpe_files`), so nothing needs the network or an exported
``TIKTOKEN_CACHE_DIR``; otherwise tiktoken loads it its own way (``$TIKTOKEN_CACHE_DIR/<sha1 of the download
URL>``, else a download).

Text is encoded with :meth:`tiktoken.Encoding.encode_ordinary`: a document that happens to contain
``<|endoftext|>`` is counted as ordinary text instead of raising, as ``encode`` would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import tiktoken

from shardfuse.pipeline.core.bpe_files import offline_encoding
from shardfuse.pipeline.core.errors import ConfigurationError

DEFAULT_ENCODING = "cl100k_base"

_CACHE_HELP = (
    "tiktoken could not load encoding {name!r} ({error}). On an offline host, put the encoding's .tiktoken file "
    "(cl100k_base.tiktoken) in a folder and set chunking.bpe_dir to it (SHARDFUSE_CHUNKING__BPE_DIR=/path/to/"
    "folder), or pre-seed tiktoken's cache: copy it into a folder under the name sha1(<download URL>) "
    "(cl100k_base: 9b5ad71b2ce5302211f9c61530b329a4922fc6a4) and `export TIKTOKEN_CACHE_DIR=<that folder>`."
)


@dataclass(frozen=True, slots=True)
class TokenOffsets:
    """A text's tokens and, for every token boundary, the character offset where it falls.

    ``char_bounds`` has ``len(tokens) + 1`` entries: entry ``k`` is the boundary before token ``k``
    (the last entry is ``len(text)``). A boundary that falls inside a multi-byte character is snapped
    *down* to the start of that character, as :meth:`tiktoken.Encoding.decode_with_offsets` does, so every
    entry is a valid ``str`` index that never splits a character. The entries are non-decreasing.
    """

    tokens: list[int]
    char_bounds: npt.NDArray[np.int64]


class TokenCounter:
    """Counts and encodes text with one tiktoken encoding (``cl100k_base`` unless told otherwise).

    ``bpe_dir``: the folder holding the encoding's BPE file (``chunking.bpe_dir``); None looks in the
    checkout's ``.cache/tiktoken``, then lets tiktoken find or download it.
    """

    def __init__(self, encoding: str = DEFAULT_ENCODING, *, bpe_dir: Path | None = None) -> None:
        if encoding not in tiktoken.list_encoding_names():
            raise ConfigurationError(
                f"unknown tiktoken encoding {encoding!r}; known: {', '.join(tiktoken.list_encoding_names())}"
            )
        # Built from a file on disk when there is one (memoised, like tiktoken's own: many counters are cheap).
        local = offline_encoding(encoding, bpe_dir=bpe_dir)
        try:
            self._encoding = local or tiktoken.get_encoding(encoding)
        except (OSError, ValueError) as exc:
            # OSError covers requests' ConnectionError (offline, cache miss); ValueError a cached file whose
            # hash does not match.
            raise ConfigurationError(_CACHE_HELP.format(name=encoding, error=exc)) from exc
        # Byte length of every token id, built on first use of encode_with_offsets (~70 ms for cl100k).
        self._token_lengths: npt.NDArray[np.int64] | None = None

    @property
    def encoding_name(self) -> str:
        """The tiktoken encoding's name, e.g. ``"cl100k_base"``."""
        return self._encoding.name

    def count(self, text: str) -> int:
        """The number of tokens in ``text``."""
        return len(self._encoding.encode_ordinary(text))

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text`` (special-token strings are treated as ordinary text)."""
        return self._encoding.encode_ordinary(text)

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens``; a token sequence that splits a character decodes it as U+FFFD."""
        return self._encoding.decode(list(tokens))

    def encode_with_offsets(self, text: str) -> TokenOffsets:
        """Encode ``text`` and map every token boundary to a character offset (see :class:`TokenOffsets`).

        Equivalent to ``decode_with_offsets(encode(text))`` plus the final ``len(text)``, but vectorised:
        that method walks every byte in Python, several times slower than the encoding itself.
        """
        data = text.encode("utf-8")
        tokens = self._encoding.encode_ordinary(text)
        lengths = self._lengths_table()[np.asarray(tokens, dtype=np.int64)]
        byte_bounds = np.zeros(len(tokens) + 1, dtype=np.int64)
        np.cumsum(lengths, out=byte_bounds[1:])
        # Byte offset where each character starts: every byte that is not a UTF-8 continuation byte
        # (0b10xxxxxx) starts one. The extra entry maps the end of the text.
        raw = np.frombuffer(data, dtype=np.uint8)
        char_starts = np.append(np.flatnonzero((raw & 0xC0) != 0x80), len(data)).astype(np.int64)
        # The character holding a boundary's byte is the last one starting at or before it: snapping down.
        char_bounds = np.searchsorted(char_starts, byte_bounds, side="right").astype(np.int64) - 1
        return TokenOffsets(tokens=tokens, char_bounds=char_bounds)

    def _lengths_table(self) -> npt.NDArray[np.int64]:
        # A lookup table beats decode_tokens_bytes, which makes one Python call per token.
        if self._token_lengths is None:
            size = self._encoding.max_token_value + 1
            self._token_lengths = np.fromiter(
                (self._token_length(i) for i in range(size)), dtype=np.int64, count=size
            )
        return self._token_lengths

    def _token_length(self, token: int) -> int:
        try:
            return len(self._encoding.decode_single_token_bytes(token))
        except KeyError:  # a gap in the vocabulary; encode never produces it
            return 0
