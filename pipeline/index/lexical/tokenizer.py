"""The one tokenizer shared by BM25 indexing and BM25 querying.

Index and query must agree token for token, so both sides use the same :class:`Tokenizer` and its
:attr:`~Tokenizer.name` is recorded in every shard manifest: a reader never searches an index built by a
different tokenizer (the shard is rebuilt instead).

Code-aware: identifiers are split at ``snake_case`` underscores, ``camelCase``/``PascalCase`` humps,
``SCREAMING_SNAKE`` words and letter/digit boundaries, and the whole identifier is kept as a token too, so
``getUserId`` matches a query for "get user id" and one for "getUserId". Tokens are lower-cased, English and
code stopwords dropped, and (optionally) Snowball-stemmed; whole identifiers are not stemmed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import Stemmer

from shardfuse.pipeline.core.words import words as words_of

TOKENIZER_VERSION = "code-v1"

# fmt: off
ENGLISH_STOPWORDS: frozenset[str] = frozenset({
    "a", "about", "an", "and", "are", "as", "at", "be", "been", "but", "by", "can", "could", "did", "do",
    "does", "for", "from", "had", "has", "have", "he", "her", "his", "how", "i", "if", "in", "into", "is",
    "it", "its", "me", "my", "of", "on", "or", "our", "she", "should", "so", "than", "that", "the", "their",
    "them", "then", "there", "these", "they", "this", "those", "to", "was", "we", "were", "what", "when",
    "where", "which", "who", "why", "will", "with", "would", "you", "your",
})
# Words every Python (and most other) source file is full of: as search terms they select nothing.
CODE_STOPWORDS: frozenset[str] = frozenset({
    "self", "cls", "def", "return", "import", "none", "null", "true", "false", "elif", "else", "pass",
    "var", "let", "const", "args", "kwargs", "param", "params", "returns", "type", "str", "int",
})
# fmt: on
STOPWORDS = ENGLISH_STOPWORDS | CODE_STOPWORDS

# One part of an ASCII identifier: an acronym before a capitalised word (HTTP|Server), a capitalised or
# lower-case word, an all-caps run, or a run of digits.
_ASCII_PART = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
# Other scripts: identifiers there are rare and case humps unreliable, so split at digits only.
_OTHER_PART = re.compile(r"\d+|[^\W\d_]+")


def split_identifier(word: str) -> list[str]:
    """``"HTTPServer2_getUserID"`` → ``["HTTP", "Server", "2", "get", "User", "ID"]``."""
    return [
        part
        for piece in word.split("_")
        for part in (_ASCII_PART if piece.isascii() else _OTHER_PART).findall(piece)
    ]


# Words whose tokens a tokenizer remembers (a corpus's vocabulary is far smaller than its word count: a
# rebuild tokenises every word of the shard, and most are repeats). Forgotten wholesale when full.
WORD_CACHE_SIZE = 200_000


@dataclass(frozen=True)
class Tokenizer:
    """Code-aware tokens for BM25; ``stem`` applies the English Snowball stemmer (PyStemmer)."""

    stem: bool = True
    _stemmer: Any = field(init=False, repr=False, compare=False, default=None)
    _words: dict[str, tuple[str, ...]] = field(init=False, repr=False, compare=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.stem:
            object.__setattr__(self, "_stemmer", Stemmer.Stemmer("english"))

    @property
    def name(self) -> str:
        return f"{TOKENIZER_VERSION}+snowball-en" if self.stem else TOKENIZER_VERSION

    def __call__(self, text: str) -> list[str]:
        tokens: list[str] = []
        remembered = self._words.get  # a method call only for a word not seen before: this loop is hot
        for word in words_of(text):
            known = remembered(word)
            tokens.extend(self._learn(word) if known is None else known)
        return tokens

    def _learn(self, word: str) -> tuple[str, ...]:
        if len(self._words) >= WORD_CACHE_SIZE:
            self._words.clear()
        known = self._words[word] = self._word_tokens(word)
        return known

    def _word_tokens(self, word: str) -> tuple[str, ...]:
        parts = split_identifier(word)
        lowered = [p.lower() for p in parts if len(p) > 1 or p.isdigit()]
        kept = [p for p in lowered if p not in STOPWORDS]
        if self._stemmer is not None and kept:
            kept = self._stemmer.stemWords(kept)
        if len(parts) > 1:
            whole = word.lower()
            if whole not in STOPWORDS:
                kept = [*kept, whole]
        return tuple(kept)
