"""The one tokenizer shared by BM25 indexing and BM25 querying.

Index and query must agree token for token, so both sides call :func:`tokenize` and the name of the
tokenizer is recorded in every shard manifest (:data:`TOKENIZER_NAME`): a reader refuses an index built by
a different tokenizer instead of silently returning nothing. A code-aware tokenizer will replace this one;
it should get a new name.
"""

from __future__ import annotations

import re

TOKENIZER_NAME = "simple-v1"

# Words so common in English prose that they only add postings and noise. Kept short on purpose: code
# identifiers such as ``if``/``for``/``not`` are meaningful search terms and a later tokenizer may index them.
# fmt: off
STOPWORDS: frozenset[str] = frozenset(
    {
        "a", "an", "and", "are", "as", "at", "be", "been", "but", "by", "for", "from", "has", "have", "he",
        "her", "his", "in", "into", "is", "it", "its", "of", "on", "or", "our", "she", "so", "than", "that",
        "the", "their", "them", "then", "there", "these", "they", "this", "those", "to", "was", "we", "were",
        "what", "when", "which", "who", "will", "with", "you", "your",
    }
)
# fmt: on

_WORD = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
    """Split ``text`` into lower-case word tokens, without stopwords and one-character tokens.

    A word is a run of ``\\w`` characters (letters, digits, underscore, in any script), so
    ``snake_case_name`` stays one token while ``a.b-c`` splits on the punctuation.
    """
    return [token for token in _WORD.findall(text.lower()) if len(token) > 1 and token not in STOPWORDS]
