"""What query expansion asks the model, and what its answer becomes: pure functions, no I/O.

:class:`Expansion` is the result; :func:`build_messages` writes the chat prompt; :func:`parse_expansion`
turns the reply into an expansion (tolerating code fences, dropping duplicates, repeats of the query and
wrong types, capping counts and lengths) or raises ``ValueError``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardfuse.pipeline.core import json_depth

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

# Bump whenever the prompt or the parser changes what an expansion contains: cached expansions are keyed by it.
PROMPT_VERSION = 1
MAX_VARIANT_CHARS = 300
MAX_PASSAGE_CHARS = 1200


@dataclass(frozen=True, slots=True)
class Expansion:
    """What the model suggested for one query; every entry differs from the query and from each other."""

    lexical: tuple[str, ...] = ()  # keyword variants for the BM25 leg
    questions: tuple[str, ...] = ()  # paraphrased questions for the vector leg
    passage: str | None = None  # a short hypothetical answer (HyDE) for the vector leg

    @property
    def is_empty(self) -> bool:
        return not (self.lexical or self.questions or self.passage)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; :meth:`from_dict` reads it back."""
        return {"lexical": list(self.lexical), "questions": list(self.questions), "passage": self.passage}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Expansion:
        """The expansion :meth:`to_dict` wrote. Raises ``ValueError`` on any other shape (a corrupt entry)."""
        lexical, questions, passage = data.get("lexical", []), data.get("questions", []), data.get("passage")
        for name, values in (("lexical", lexical), ("questions", questions)):
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise ValueError(f"expansion {name!r} must be a list of strings")
        if passage is not None and not isinstance(passage, str):
            raise ValueError("expansion 'passage' must be a string or null")
        return cls(lexical=tuple(lexical), questions=tuple(questions), passage=passage)


_SYSTEM_PROMPT = """\
You expand search queries for a hybrid search engine over source code and technical documents. \
The engine runs a keyword (BM25) search and a semantic (embedding) search.

Reply with exactly one JSON object and nothing else:
{{"lexical": [...], "questions": [...], "passage": "..."}}

- "lexical": up to {n} keyword variants for the keyword search: synonyms, related technical terms, \
identifier spellings (snake_case, camelCase, PascalCase), short reformulations. Keywords, not sentences.
- "questions": up to {n} paraphrases of the query as natural-language questions.
- "passage": a short passage (two to four sentences) that would answer the query, written the way \
documentation or a code comment would say it.

Never repeat the query itself. Use an empty list when you have nothing useful to add."""


def build_messages(query: str, *, max_variants: int) -> list[ChatCompletionMessageParam]:
    """The chat messages asking for an expansion of ``query`` with at most ``max_variants`` per list."""
    return [
        {"role": "system", "content": _SYSTEM_PROMPT.format(n=max_variants)},
        {"role": "user", "content": query},
    ]


_FENCE = re.compile(r"^\s*```[A-Za-z0-9_-]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)


def _json_object(text: str) -> dict[str, Any]:
    fenced = _FENCE.match(text)
    body = fenced.group(1) if fenced else text
    # json_depth: a reply nested past its bound is refused (a TooDeepError, a ValueError), never decoded.
    try:
        data = json_depth.loads(body)
    except json.JSONDecodeError:
        # Some models wrap the object in a sentence; take the outermost braces before giving up.
        start, end = body.find("{"), body.rfind("}")
        if start < 0 or end <= start:
            raise ValueError("no JSON object in the model's reply") from None
        try:
            data = json_depth.loads(body[start : end + 1])
        except json.JSONDecodeError as exc:
            raise ValueError(f"the model's reply is not valid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ValueError(f"the model's reply is a JSON {type(data).__name__}, not an object")
    return data


def normalised(text: str) -> str:
    return " ".join(text.split())


def _variants(values: object, *, seen: set[str], limit: int) -> tuple[str, ...]:
    """Strings only, whitespace collapsed, capped in length; blank entries, surplus ones and those already
    in ``seen`` (case-insensitively; it starts with the query and grows as entries are kept) dropped."""
    if not isinstance(values, list):
        return ()
    kept: list[str] = []
    for value in values:
        if len(kept) >= limit:
            break
        if not isinstance(value, str):
            continue
        text = normalised(value)[:MAX_VARIANT_CHARS].rstrip()
        if text and text.casefold() not in seen:
            seen.add(text.casefold())
            kept.append(text)
    return tuple(kept)


def parse_expansion(text: str, *, query: str, max_variants: int) -> Expansion:
    """The :class:`Expansion` in a model reply ``text`` (a JSON object, possibly inside a code fence).

    Tolerant of what models do: wrong types, blanks, duplicates and echoes of ``query`` are dropped, each
    list is cut to ``max_variants``, and lengths are capped. Raises ``ValueError`` when the reply holds no
    JSON object or an object with none of the expected keys.
    """
    data = _json_object(text)
    if not data.keys() & {"lexical", "questions", "passage"}:
        raise ValueError(f"the model's reply has none of lexical, questions, passage (keys: {sorted(data)[:5]})")
    query_key = normalised(query).casefold()
    lexical = _variants(data.get("lexical"), seen={query_key}, limit=max_variants)
    # Questions are deduplicated separately: the same words may serve both legs.
    questions = _variants(data.get("questions"), seen={query_key}, limit=max_variants)
    passage = data.get("passage")
    if isinstance(passage, str):
        passage = normalised(passage)[:MAX_PASSAGE_CHARS].rstrip() or None
        if passage is not None and passage.casefold() == query_key:
            passage = None
    else:
        passage = None
    return Expansion(lexical=lexical, questions=questions, passage=passage)
