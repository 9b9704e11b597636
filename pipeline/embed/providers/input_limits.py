"""What a remote embedding provider accepts, and fitting inputs to it: pure functions, no I/O.

A provider request has three size limits (inputs per request, tokens per request, tokens per input). The
batcher packs requests under the first two; :func:`fit_input` applies the configured oversize rule
(``embedder.oversize_input``) to one input over the third. Token counts come from a :class:`TokenCounting`
per provider: exact for OpenAI (its models use tiktoken's ``cl100k_base``), a deliberate over-estimate for
Voyage (see :func:`voyage_counter`), so that a count that fits here also fits at the provider.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, NamedTuple, Protocol

import numpy as np

from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.embed.providers.base import Vectors

OversizeRule = Literal["truncate", "split"]

# A character is at most 4 UTF-8 bytes, so at most 4 byte-level BPE tokens: any budget of 4 or more lets
# every piece hold at least one character.
_MIN_BUDGET = 4


@dataclass(frozen=True, slots=True)
class ProviderLimits:
    """A provider's documented request limits for one model, and the batch size we default to."""

    max_inputs_per_request: int
    max_tokens_per_request: int
    max_tokens_per_input: int
    # Smaller than the maximum on purpose: a failed request re-sends less work, and latency stays low.
    default_batch_size: int
    # An in-process model pays for padding (each batch runs at its longest input's length): the embedding
    # stage cuts its requests from the flush's texts sorted by length. A remote provider keeps arrival order,
    # so a failed request fails the few documents whose chunks it held, not a scatter of them.
    length_sorted: bool = False

    def __post_init__(self) -> None:
        if min(self.max_inputs_per_request, self.max_tokens_per_request, self.max_tokens_per_input) < 1:
            raise ValueError(f"provider limits must be positive: {self}")
        if not 1 <= self.default_batch_size <= self.max_inputs_per_request:
            raise ValueError(f"default_batch_size must be within 1..max_inputs_per_request: {self}")


# https://platform.openai.com/docs/api-reference/embeddings/create (same for ada-002 and text-embedding-3-*).
OPENAI_LIMITS = ProviderLimits(
    max_inputs_per_request=2048, max_tokens_per_request=300_000, max_tokens_per_input=8192, default_batch_size=256
)

# https://docs.voyageai.com/reference/embeddings-api: at most 1,000 texts per request, and a per-model cap
# on the request's total tokens. The voyage-3 generation (and later) reads 32,000 tokens per input.
_VOYAGE_MAX_INPUTS = 1000
_VOYAGE_CONTEXT = 32_000
_VOYAGE_BATCH = 128  # the SDK's own VOYAGE_EMBED_BATCH_SIZE
_VOYAGE_REQUEST_TOKENS: Mapping[str, int] = {
    "voyage-4-lite": 1_000_000,
    "voyage-3.5-lite": 1_000_000,
    "voyage-3-lite": 1_000_000,
    "voyage-4": 320_000,
    "voyage-3.5": 320_000,
    "voyage-3": 320_000,
    "voyage-2": 320_000,
    "voyage-4-large": 120_000,
    "voyage-3-large": 120_000,
    "voyage-code-3": 120_000,
    "voyage-finance-2": 120_000,
    "voyage-law-2": 120_000,
    "voyage-multilingual-2": 120_000,
    "voyage-large-2": 120_000,
    "voyage-large-2-instruct": 120_000,
    "voyage-code-2": 120_000,
}
# Older models read less than 32K tokens per input.
_VOYAGE_CONTEXT_BY_MODEL: Mapping[str, int] = {
    "voyage-2": 4000,
    "voyage-large-2": 16_000,
    "voyage-large-2-instruct": 16_000,
    "voyage-code-2": 16_000,
    "voyage-law-2": 16_000,
    "voyage-finance-2": 32_000,
    "voyage-multilingual-2": 32_000,
}
# An unknown model gets the smallest documented request cap: too small costs requests, too large fails them.
_VOYAGE_UNKNOWN_REQUEST_TOKENS = 120_000


def voyage_limits(model: str) -> ProviderLimits:
    """Voyage's limits for ``model`` (the most conservative documented ones when the model is unknown)."""
    return ProviderLimits(
        max_inputs_per_request=_VOYAGE_MAX_INPUTS,
        max_tokens_per_request=_VOYAGE_REQUEST_TOKENS.get(model, _VOYAGE_UNKNOWN_REQUEST_TOKENS),
        max_tokens_per_input=_VOYAGE_CONTEXT_BY_MODEL.get(model, _VOYAGE_CONTEXT),
        default_batch_size=_VOYAGE_BATCH,
    )


class TokenCounting(Protocol):
    """Counts tokens the way one provider does (or over-estimates them), and cuts text to a budget."""

    def count(self, text: str) -> int:
        """The number of tokens ``text`` costs at the provider (never an under-estimate)."""
        ...

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of ``text`` that counts at most ``max_tokens``."""
        ...

    def split(self, text: str, max_tokens: int) -> list[str]:
        """Consecutive pieces of ``text``, each counting at most ``max_tokens``, that join back to ``text``."""
        ...


class TiktokenCounter:
    """:class:`TokenCounting` over a tiktoken encoding, optionally scaled up by ``scale`` (≥ 1).

    With a scale, ``count`` is ``ceil(tiktoken tokens × scale)`` and cutting to ``max_tokens`` keeps at most
    ``floor(max_tokens / scale)`` tiktoken tokens, so every piece's ``count`` stays within ``max_tokens``.
    Cuts fall on token boundaries snapped to whole characters; each piece is re-counted, because the tokens
    of a piece of text are not always the tokens of that stretch inside the whole text.
    """

    def __init__(self, encoding: str = "cl100k_base", *, scale: Fraction = Fraction(1)) -> None:
        if scale < 1:
            raise ValueError(f"scale must be at least 1 (an over-estimate), got {scale}")
        self._tokens = TokenCounter(encoding)
        self._scale = scale

    @property
    def encoding_name(self) -> str:
        return self._tokens.encoding_name

    @property
    def scale(self) -> Fraction:
        return self._scale

    def count(self, text: str) -> int:
        return math.ceil(self._tokens.count(text) * self._scale)

    def truncate(self, text: str, max_tokens: int) -> str:
        pieces = self._pieces(text, self._budget(max_tokens), first_only=True)
        return pieces[0] if pieces else ""

    def split(self, text: str, max_tokens: int) -> list[str]:
        return self._pieces(text, self._budget(max_tokens), first_only=False)

    def _budget(self, max_tokens: int) -> int:
        budget = math.floor(max_tokens / self._scale)
        if budget < _MIN_BUDGET:
            raise ValueError(f"max_tokens {max_tokens} is too small to cut text to (scale {self._scale})")
        return budget

    def _pieces(self, text: str, budget: int, *, first_only: bool) -> list[str]:
        offsets = self._tokens.encode_with_offsets(text)
        bounds, total = offsets.char_bounds, len(offsets.tokens)
        if total <= budget:
            return [text] if text else []
        pieces: list[str] = []
        start = 0
        while start < len(text):
            # Every cut is a token boundary, so ``start`` is one too: the first token of this piece.
            first = int(np.searchsorted(bounds, start, side="left"))
            last = min(first + budget, total)
            while True:
                end = max(int(bounds[last]), start + 1)  # always move on by at least one character
                piece = text[start:end]
                excess = self._tokens.count(piece) - budget
                if excess <= 0 or end == start + 1:
                    break
                last = max(first, last - excess)
            pieces.append(piece)
            if first_only:
                break
            start = end
        return pieces


def openai_counter(model: str) -> TiktokenCounter:
    """The exact counter for OpenAI's embedding models: ada-002 and text-embedding-3-* all use cl100k_base.

    An unknown model (an OpenAI-compatible server) is counted with cl100k_base too, the best guess there is.
    """
    del model  # every current OpenAI embedding model shares the encoding
    return TiktokenCounter("cl100k_base")


# Voyage counts with its own Hugging Face tokenizers, which cannot be loaded offline (and the SDK's
# count_tokens downloads them). cl100k_base counts with a 20% margin stand in for them: the margin is a
# safety allowance, not a measured ratio, paid for with requests about a sixth smaller than they could be.
VOYAGE_TOKEN_SCALE = Fraction(6, 5)


def voyage_counter(model: str) -> TiktokenCounter:
    """A conservative counter for Voyage models: cl100k_base tokens × :data:`VOYAGE_TOKEN_SCALE`, rounded up."""
    del model
    return TiktokenCounter("cl100k_base", scale=VOYAGE_TOKEN_SCALE)


class FittedInput(NamedTuple):
    """One input made to fit a provider: its pieces (one, unless split) and whether it was over the limit."""

    pieces: tuple[str, ...]
    was_oversize: bool


def fit_input(text: str, counter: TokenCounting, limits: ProviderLimits, rule: OversizeRule) -> FittedInput:
    """``text`` within ``limits.max_tokens_per_input``: unchanged when it fits, else cut by ``rule``.

    ``"truncate"`` keeps the first tokens; ``"split"`` returns every piece, to be embedded separately and
    combined with :func:`merge_pieces`. The caller counts ``was_oversize`` inputs and reports them.
    """
    limit = limits.max_tokens_per_input
    if counter.count(text) <= limit:
        return FittedInput((text,), False)
    if rule == "truncate":
        return FittedInput((counter.truncate(text, limit),), True)
    if rule == "split":
        return FittedInput(tuple(counter.split(text, limit)), True)
    raise ValueError(f"unknown oversize rule {rule!r}; expected 'truncate' or 'split'")


def merge_pieces(vectors: Vectors, weights: Sequence[float] | None = None) -> Vectors:
    """One unit vector for a split input: the (weighted, e.g. by token count) mean of its pieces' rows."""
    if vectors.ndim != 2 or len(vectors) == 0:
        raise ValueError(f"expected a non-empty (pieces, dimensions) array, got shape {vectors.shape}")
    w = np.ones(len(vectors)) if weights is None else np.asarray(weights, dtype=np.float64)
    mean = (vectors.astype(np.float64) * w[:, None]).sum(axis=0)
    norm = float(np.linalg.norm(mean))
    if norm == 0.0:
        raise ValueError("the pieces' vectors cancel out")
    merged: Vectors = (mean / norm).astype(np.float32)
    return merged


def check_request(texts: Sequence[str], counter: TokenCounting, limits: ProviderLimits, *, source: str) -> None:
    """Raise ValueError when ``texts`` do not fit one request: packing and fitting are the caller's job.

    A programming error, not a provider failure: sending it would only earn a 400 for the whole batch.
    """
    if len(texts) > limits.max_inputs_per_request:
        raise ValueError(
            f"{source} takes at most {limits.max_inputs_per_request} inputs per request, got {len(texts)}; "
            "pack smaller batches"
        )
    total = 0
    for position, text in enumerate(texts):
        tokens = counter.count(text)
        if tokens > limits.max_tokens_per_input:
            raise ValueError(
                f"input {position} counts {tokens} tokens, over {source}'s {limits.max_tokens_per_input} per "
                "input; apply fit_input first"
            )
        total += tokens
    if total > limits.max_tokens_per_request:
        raise ValueError(
            f"the batch counts {total} tokens, over {source}'s {limits.max_tokens_per_request} per request; "
            "pack smaller batches"
        )
