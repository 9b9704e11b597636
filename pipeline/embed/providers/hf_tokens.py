"""Counting and cutting text in a local model's own tokenizer (Hugging Face ``tokenizers``): pure, no model.

all-MiniLM-L6-v2 reads at most 256 word-pieces, ``[CLS]`` and ``[SEP]`` included, and sentence-transformers
drops whatever comes after without a word. :class:`HuggingFaceCounter` is the :class:`TokenCounting` the
embedding stage fits inputs with (``embedder.oversize_input``) and the ingest stage sizes chunks with
(``chunking.fit_embedder``), so that "fits" means the same as in the model: counts include the special
tokens the model adds around every input.

Cuts fall where a word starts (never inside ``em ##bed ##ding``, which would tokenize differently on its
own), and every piece is counted again before it is returned: the normaliser (lower-casing, accent
stripping) can make a piece's tokens differ from that stretch of the whole text.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

# A piece must hold at least a few word-pieces besides the special tokens.
_MIN_BUDGET = 4


class HuggingFaceCounter:
    """:class:`~shardfuse.pipeline.embed.providers.input_limits.TokenCounting` over one model's tokenizer.

    The tokenizer is copied and its own truncation and padding switched off (``tokenizer.json`` files carry
    them, e.g. truncation at 128 for all-MiniLM-L6-v2, and the transformers wrapper changes them per call):
    counting must see every token, and two threads must never share that state.
    """

    def __init__(self, tokenizer: Tokenizer, *, name: str = "") -> None:
        from tokenizers import Tokenizer as _Tokenizer

        self._tokenizer = _Tokenizer.from_str(tokenizer.to_str())
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        processor = self._tokenizer.post_processor
        self._specials = processor.num_special_tokens_to_add(False) if processor is not None else 0
        self.name = name

    @classmethod
    def from_file(cls, path: Path, *, name: str = "") -> HuggingFaceCounter:
        """The counter of a ``tokenizer.json`` file (a model folder's fast tokenizer)."""
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)), name=name)

    @property
    def special_tokens(self) -> int:
        """Tokens the model adds around every input (``[CLS]`` and ``[SEP]``: 2)."""
        return self._specials

    def count(self, text: str) -> int:
        """Tokens the model reads for ``text``, special tokens included."""
        return len(self._encode(text).ids) + self._specials

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """:meth:`count` of each text, encoded as one batch (without offsets: only the lengths are needed)."""
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [len(e.ids) + self._specials for e in encodings]

    def truncate(self, text: str, max_tokens: int) -> str:
        pieces = self._pieces(text, max_tokens, first_only=True)
        return pieces[0] if pieces else ""

    def split(self, text: str, max_tokens: int) -> list[str]:
        return self._pieces(text, max_tokens, first_only=False)

    def _encode(self, text: str) -> Encoding:
        return self._tokenizer.encode(text, add_special_tokens=False)

    def _pieces(self, text: str, max_tokens: int, *, first_only: bool) -> list[str]:
        budget = max_tokens - self._specials
        if budget < _MIN_BUDGET:
            raise ValueError(f"max_tokens {max_tokens} is too small to cut text to ({self._specials} special tokens)")
        whole = self._encode(text)
        if len(whole.ids) <= budget:
            return [text] if text else []
        starts = [offset[0] for offset in whole.offsets]
        pieces: list[str] = []
        start = 0
        while start < len(text):
            end = self._piece_end(text, whole, starts, start, budget)
            pieces.append(text[start:end])
            if first_only:
                break
            start = end
        return pieces

    def _piece_end(self, text: str, whole: Encoding, starts: list[int], start: int, budget: int) -> int:
        """Where the piece from ``start`` ends: after at most ``budget`` tokens of the whole text's encoding,
        at a word's start if one is in reach, moved back until the piece on its own counts within budget."""
        first = bisect_left(starts, start)  # the first token at or after ``start``
        last = first + budget
        while True:
            if last >= len(starts):
                end = len(text)
            else:
                end = max(starts[_word_start_at_or_before(whole, last, floor=first)], start + 1)
            excess = len(self._encode(text[start:end]).ids) - budget
            if excess <= 0 or end == start + 1:
                return end
            last = max(first + 1, min(last, len(starts)) - excess)


def _word_start_at_or_before(encoding: Encoding, index: int, *, floor: int) -> int:
    """The last token in ``floor + 1 .. index`` that starts a word, else ``index`` (one word longer than the
    whole budget is cut inside)."""
    words = encoding.word_ids
    cut = index
    while cut > floor + 1 and words[cut] is not None and words[cut] == words[cut - 1]:
        cut -= 1
    return cut if words[cut] is None or cut == index or words[cut] != words[cut - 1] else index


def max_seq_length(model_dir: Path) -> int | None:
    """The input limit sentence-transformers applies to the model in ``model_dir``: ``max_seq_length`` of
    ``sentence_bert_config.json``, else the tokenizer's ``model_max_length``, else the transformer's
    ``max_position_embeddings`` (None when none is there)."""
    for file, key in (("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length"),
                      ("config.json", "max_position_embeddings")):
        path = model_dir / file
        if not path.is_file():
            continue
        value = json.loads(path.read_text(encoding="utf-8")).get(key)
        # transformers writes a huge sentinel (int(1e30)) for "no limit" in model_max_length.
        if isinstance(value, int) and 0 < value < 1_000_000:
            return value
    return None
