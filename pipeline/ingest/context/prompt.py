"""What contextual retrieval asks the chat model, and what its answer becomes: pure functions, no I/O.

Anthropic's Contextual Retrieval prepends to every chunk a short, model-written context that situates it
within its document ("This chunk is from the 2023 annual report's section on ..."), so that both the BM25
and the vector leg can match a chunk on what its document is about, not only on its own words.

The document comes first and the chunk last: every request for the chunks of one document then starts with
the same tokens, and providers that cache prompt prefixes (OpenAI automatically, above 1,024 tokens) bill
and compute that shared prefix once. Nothing that varies per chunk may move before the document.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardfuse.pipeline.core.token_counting import TokenCounter

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionMessageParam

# Bump whenever the prompt or the post-processing changes what a context says: cached contexts are keyed by it.
PROMPT_VERSION = "1"
# Longest context kept, in tokens; the prompt asks for 50 to 100, this only stops a rambling answer.
MAX_CONTEXT_TOKENS = 200
# Chat formats spend a few tokens per message on roles and separators.
_MESSAGE_OVERHEAD_TOKENS = 8

_DOCUMENT_OPEN = "<document>\n"
_DOCUMENT_CLOSE = "\n</document>\n"
_TRUNCATED = "\n[... document truncated: only its first {kept} of {total} tokens are shown ...]"
_CHUNK_TEMPLATE = """\
Here is the chunk we want to situate within the whole document
<chunk>
{chunk}
</chunk>
Please give a short succinct context (one to three sentences, 50 to 100 tokens) to situate this chunk \
within the overall document for the purposes of improving search retrieval of the chunk. Answer only with \
the succinct context and nothing else."""


@dataclass(frozen=True, slots=True)
class DocumentSection:
    """The document part of every prompt for one document: the shared prefix of its chunks' requests."""

    text: str  # "<document>\n...\n</document>\n", the truncation mark included
    tokens: int  # tokens of ``text`` (an estimate at the joins, where tiktoken may merge differently)
    truncated: bool


def document_section(document: str, *, counter: TokenCounter, token_budget: int) -> DocumentSection:
    """``document`` wrapped for the prompt, cut to its first ``token_budget`` tokens when longer.

    The cut falls on a token boundary snapped to a character boundary, and is marked in the text so the
    model knows the document goes on.
    """
    if token_budget < 1:
        raise ValueError(f"token_budget must be positive, got {token_budget}")
    total = counter.count(document)
    body, truncated = document, total > token_budget
    if truncated:
        cut = int(counter.encode_with_offsets(document).char_bounds[token_budget])
        body = document[:cut] + _TRUNCATED.format(kept=token_budget, total=total)
    text = _DOCUMENT_OPEN + body + _DOCUMENT_CLOSE
    tokens = counter.count(_DOCUMENT_OPEN) + min(total, token_budget) + counter.count(_DOCUMENT_CLOSE)
    if truncated:
        tokens += counter.count(_TRUNCATED.format(kept=token_budget, total=total))
    return DocumentSection(text=text, tokens=tokens, truncated=truncated)


def chunk_section(chunk: str) -> str:
    """The part of the prompt after the document: the chunk and the instruction."""
    return _CHUNK_TEMPLATE.format(chunk=chunk)


def build_messages(section: DocumentSection, chunk: str) -> list[ChatCompletionMessageParam]:
    """The chat messages asking for the context of ``chunk``: one user message, document first.

    No system message: it would sit before the document anyway, and Anthropic's prompt works without one.
    """
    return [{"role": "user", "content": section.text + chunk_section(chunk)}]


def estimate_prompt_tokens(section: DocumentSection, chunk: str, *, counter: TokenCounter) -> int:
    """The prompt's size in tokens, for backpressure and the run budget, without recounting the document."""
    return section.tokens + counter.count(chunk_section(chunk)) + _MESSAGE_OVERHEAD_TOKENS


def clean_context(answer: str | None, *, counter: TokenCounter, max_tokens: int = MAX_CONTEXT_TOKENS) -> str:
    """The model's answer stripped and cut to ``max_tokens`` tokens; ``""`` when there is nothing in it."""
    text = (answer or "").strip()
    if not text:
        return ""
    offsets = counter.encode_with_offsets(text)
    if len(offsets.tokens) <= max_tokens:
        return text
    return text[: int(offsets.char_bounds[max_tokens])].rstrip()
