"""Entropy-aware chunk filtering: duplicates, near-empty, boilerplate and low-information chunks."""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys

import pytest

from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.chunk_filter import (
    KEPT_WINDOW,
    ChunkVerdict,
    DropReason,
    FilterSettings,
    drop_counts,
    extract_entities,
    filter_chunks,
    lexical_sketch,
    token_entropy,
)
from tests.support.paths import REPO

COUNTER = TokenCounter()
DEFAULTS = FilterSettings()

CACHE = (
    "The query cache keeps fused results in Redis for ten minutes, keyed by zone, query text and fusion "
    "settings. A write to any shard of the zone bumps its generation counter, so stale entries are never "
    "served after an index change."
)
# CACHE with two words changed and nothing new named.
CACHE_EDITED = CACHE.replace("ten minutes", "fifteen minutes").replace("are never", "are not")
PACKING = (
    "Embedding batches are packed by token budget rather than by chunk count: the packer fills each request "
    "up to max_batch_tokens and splits oversized documents across calls, keeping ids and vectors in order."
)
RETRIES = (
    "Workers retry transient failures with exponential backoff and jitter, at most five times, then move "
    "the event to the dead-letter store with a reason that an operator can act on."
)


def run(texts: list[str], settings: FilterSettings = DEFAULTS) -> list[ChunkVerdict]:
    return filter_chunks(texts, counter=COUNTER, settings=settings)


def reasons(verdicts: list[ChunkVerdict]) -> list[DropReason | None]:
    return [v.reason for v in verdicts]


def paragraphs(*names: str) -> list[str]:
    """Blank-line separated paragraphs of repository files, in order."""
    found: list[str] = []
    for name in names:
        found += [p for p in re.split(r"\n[ \t]*\n", (REPO / name).read_text(encoding="utf-8")) if p.strip()]
    return found


def test_exact_duplicate_after_whitespace_normalisation_is_dropped() -> None:
    verdicts = run([CACHE, PACKING, "  " + CACHE.replace(" ", "\n  ", 3) + "\n"])
    assert reasons(verdicts) == [None, None, DropReason.DUPLICATE]
    assert [v.kept for v in verdicts] == [True, True, False]
    assert verdicts[2].score is None and verdicts[2].tokens > 0
    assert drop_counts(verdicts) == {"duplicate": 1}


@pytest.mark.parametrize("text", ["----", "\n\n  \n", "}", "", "... !!! ??? (( ))", "Short line here."])
def test_near_empty_chunks_are_dropped(text: str) -> None:
    verdicts = run([CACHE, text, PACKING])
    assert reasons(verdicts) == [None, DropReason.NEAR_EMPTY, None]
    assert verdicts[1].score is None and verdicts[1].entity_novelty is None


def test_min_tokens_counts_content_tokens_only() -> None:
    # Eight words padded with punctuation: NEAR_EMPTY at min_tokens=9, kept at 8.
    text = "--- (one) two, three; four: five - six ... seven! eight? ---"
    assert run([CACHE, text], FilterSettings(min_tokens=9))[1].reason is DropReason.NEAR_EMPTY
    assert run([CACHE, text], FilterSettings(min_tokens=8))[1].kept


@pytest.mark.parametrize("text", ["= " * 40, "All rights reserved. " * 6, "|" + " |" * 30])
def test_boilerplate_is_dropped_by_token_entropy(text: str) -> None:
    verdicts = run([CACHE, text, PACKING])
    assert reasons(verdicts) == [None, DropReason.BOILERPLATE, None]
    assert verdicts[1].entropy_bits < DEFAULTS.min_entropy_bits
    assert verdicts[1].score is None


def test_token_entropy_in_bits() -> None:
    assert token_entropy([]) == 0.0
    assert token_entropy([7] * 50) == 0.0
    assert token_entropy([1, 2, 3, 4] * 10) == pytest.approx(2.0)
    # Repeating a text does not raise its entropy: k distinct tokens give at most log2(k) bits.
    line = COUNTER.encode("Copyright 2024 Acme Corp. All rights reserved.\n")
    assert token_entropy(line * 20) == pytest.approx(token_entropy(line))
    assert token_entropy(line) <= math.log2(len(set(line)))


def test_edited_repeat_is_low_information_while_a_new_paragraph_is_kept() -> None:
    verdicts = run([CACHE, PACKING, CACHE_EDITED, RETRIES])
    assert reasons(verdicts) == [None, None, DropReason.LOW_INFORMATION, None]
    edited = verdicts[2]
    assert edited.entity_novelty == 0.0
    assert edited.semantic_novelty is not None and edited.semantic_novelty < 0.5
    assert edited.score is not None and edited.score < DEFAULTS.threshold
    fresh = verdicts[3]
    assert fresh.semantic_novelty is not None and fresh.semantic_novelty > 0.9
    assert fresh.score is not None and fresh.score >= DEFAULTS.threshold
    assert drop_counts(verdicts) == {"low_information": 1}


def test_extract_entities_finds_numbers_and_identifiers() -> None:
    text = (
        "Set retry_limit to 5 and MAX_SIZE to 10,000 in config.toml; call os.path.join and getValue on "
        "TokenCounter. The RRF and BM25 legs run on Redis 7.2 (300ms budget), e.g. on shardfuse."
    )
    assert extract_entities(text) == {
        "retry_limit",
        "5",
        "MAX_SIZE",
        "10,000",
        "config.toml",
        "os.path.join",
        "getValue",
        "TokenCounter",
        "RRF",
        "BM25",
        "Redis",
        "7.2",
        "300ms",
    }


def test_sentence_initial_capitals_are_not_entities() -> None:
    text = 'Workers start. Then they wait! "Queues" fill up?\n\n## Heading words\n- Bullet item\nwrapped Line'
    # Only "Line" is mid-sentence (a wrapped line continues its sentence).
    assert extract_entities(text) == {"Line"}
    assert extract_entities("A chunk said I think so.") == frozenset()


def test_non_ascii_text_follows_the_same_rules() -> None:
    # Non-ASCII text takes the Unicode-aware regexes; ASCII text the faster re.ASCII ones.
    text = "Grüße: der Cache in Redis hält 10,000 Einträge für max_age Sekunden, siehe config.toml."
    assert extract_entities(text) == {"Redis", "10,000", "max_age", "config.toml", "Cache", "Einträge", "Sekunden"}
    assert lexical_sketch("Café AU lait", 3) == {"café au lait"}


def test_entity_novelty_is_the_share_of_entities_not_seen_earlier() -> None:
    first = "The worker reads retry_limit from config.toml and listens on port 8080 of Redis for event batches."
    later = "The worker reads retry_limit from config.toml and listens on port 9090 of Redis for event batches."
    verdicts = run([first, later])
    assert verdicts[0].entity_novelty == 1.0
    # {retry_limit, config.toml, 9090, Redis}: only the number is new.
    assert verdicts[1].entity_novelty == pytest.approx(0.25)


def test_entities_of_dropped_chunks_count_as_seen() -> None:
    boilerplate = "deploy_id 4242 = = = = = = = = = = = = = = = = = = = = = = = = = = = = = = = ="
    named = "Rolling out deploy_id 4242 takes a few minutes while the workers drain their queues one by one."
    verdicts = run([CACHE, boilerplate, named])
    assert verdicts[1].reason is DropReason.BOILERPLATE
    assert verdicts[2].entity_novelty == 0.0


def test_chunks_without_entities_get_fixed_entity_novelty() -> None:
    plain = "every worker drains its own queue before it stops, and nothing is lost when it restarts later on."
    other = "a small cache in front of the index answers repeated questions without touching any shard at all."
    verdicts = run([plain, other])
    assert extract_entities(plain) == frozenset() and extract_entities(other) == frozenset()
    assert [v.entity_novelty for v in verdicts] == [1.0, 0.5]


def test_lexical_sketch_is_lowercased_word_shingles() -> None:
    assert lexical_sketch("The Cat sat, the cat SAT.", 3) == {"the cat sat", "cat sat the", "sat the cat"}
    assert lexical_sketch("two words", 3) == {"two words"}
    assert lexical_sketch("... --", 3) == frozenset()


def test_first_chunk_is_never_low_information() -> None:
    strict = FilterSettings(alpha=1.0, threshold=1.0)
    verdicts = run([CACHE, CACHE_EDITED, PACKING], strict)
    assert verdicts[0].kept and verdicts[0].score == 1.0
    assert verdicts[1].reason is DropReason.LOW_INFORMATION
    # Everything PACKING names is new: entity_novelty 1.0 meets even a threshold of 1.0.
    assert verdicts[2].kept


def test_first_chunk_can_be_dropped_when_others_are_kept() -> None:
    assert reasons(run(["}", CACHE])) == [DropReason.NEAR_EMPTY, None]


def test_never_drops_every_chunk() -> None:
    verdicts = run(["----", "= " * 40, "}", "----"])
    assert [v.kept for v in verdicts] == [False, True, False, False]
    assert verdicts[1].reason is None
    assert reasons(verdicts) == [DropReason.NEAR_EMPTY, None, DropReason.NEAR_EMPTY, DropReason.DUPLICATE]
    assert drop_counts(verdicts) == {"duplicate": 1, "near_empty": 2}
    # A tie on entropy keeps the earliest chunk; a single chunk is always kept.
    assert [v.kept for v in run(["}", "----"])] == [True, False]
    assert run([""])[0].kept
    assert run([]) == []


def test_verdicts_are_deterministic() -> None:
    texts = paragraphs("README.md") + [CACHE, CACHE_EDITED, "----", CACHE]
    first = run(texts)
    assert run(texts) == first
    assert filter_chunks(texts, counter=TokenCounter(), settings=FilterSettings()) == first
    assert [v.index for v in first] == list(range(len(texts)))


def test_verdicts_do_not_depend_on_the_hash_seed() -> None:
    # Sets of strings iterate in an order that depends on PYTHONHASHSEED; verdicts must not.
    script = (
        "import json, re, sys; from dataclasses import asdict; "
        "from shardfuse.pipeline.ingest.chunk_filter import FilterSettings, filter_chunks; "
        "from shardfuse.pipeline.core.token_counting import TokenCounter; "
        "texts = json.load(sys.stdin); "
        "print(json.dumps([asdict(v) for v in filter_chunks(texts, counter=TokenCounter(), "
        "settings=FilterSettings())]))"
    )
    texts = paragraphs("tests/fixtures/markdown/architecture.md") + [CACHE, CACHE_EDITED, PACKING]
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script],
            input=json.dumps(texts),
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"alpha": -0.1},
        {"alpha": 1.01},
        {"alpha": math.nan},
        {"threshold": -0.5},
        {"threshold": 1.5},
        {"min_tokens": -1},
        {"min_entropy_bits": -1.0},
        {"sketch_ngram": 0},
    ],
)
def test_settings_are_validated(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FilterSettings(**kwargs)  # type: ignore[arg-type]


def test_settings_accept_the_bounds() -> None:
    FilterSettings(alpha=0.0, threshold=0.0)
    FilterSettings(alpha=1.0, threshold=1.0)


def test_comparison_window_is_bounded_to_recent_kept_chunks() -> None:
    # Distinct filler paragraphs (their words come from disjoint numbered vocabularies) push CACHE out.
    filler = [" ".join(f"w{i}x{j}" for j in range(30)) for i in range(KEPT_WINDOW)]
    inside = run([CACHE, *filler[: KEPT_WINDOW - 1], CACHE_EDITED])
    outside = run([CACHE, *filler, CACHE_EDITED])
    assert all(v.kept for v in outside[:-1])
    assert inside[-1].reason is DropReason.LOW_INFORMATION
    assert outside[-1].semantic_novelty == 1.0 and outside[-1].kept


def test_semantic_novelty_is_exact_against_the_last_kept_window() -> None:
    # Overlapping slices of one long random text: chunks resemble many earlier ones, some are dropped, and more
    # than two windows' worth are kept. Brute force over the last KEPT_WINDOW kept sketches must agree.
    rng = random.Random(3)
    vocabulary = [f"{a}{b}" for a in "bcdfgklmnprst" for b in ("ane", "ori", "ule", "esk")]
    stream = [rng.choice(vocabulary) for _ in range(2500)]
    texts = []
    for _ in range(600):
        start = rng.randrange(0, len(stream) - 60)
        texts.append(" ".join(stream[start : start + rng.randrange(20, 60)]))
    verdicts = run(texts)
    kept: list[frozenset[str]] = []
    for verdict, text in zip(verdicts, texts, strict=True):
        if verdict.semantic_novelty is None:
            continue
        sketch = lexical_sketch(text, DEFAULTS.sketch_ngram)
        similarity = max((len(sketch & k) / len(sketch | k) for k in kept[-KEPT_WINDOW:]), default=0.0)
        assert verdict.semantic_novelty == pytest.approx(1.0 - similarity)
        if verdict.kept:
            kept.append(sketch)
    assert len(kept) > 2 * KEPT_WINDOW
    assert drop_counts(verdicts).get("low_information", 0) > 20


def test_repository_docs_keep_most_paragraphs() -> None:
    texts = paragraphs("README.md", "tests/fixtures/markdown/architecture.md")
    verdicts = run(texts)
    dropped = [texts[v.index] for v in verdicts if not v.kept]
    # What is dropped is short headings and labels ("## Query", "Publishing from Python:"): single lines
    # with fewer than min_tokens words. They make up about a quarter of blank-line paragraphs here.
    assert all(v.reason is DropReason.NEAR_EMPTY for v in verdicts if not v.kept)
    assert all("\n" not in text and len(re.findall(r"\w+", text)) < DEFAULTS.min_tokens for text in dropped)
    body = [v for v in verdicts if "\n" in texts[v.index]]
    assert sum(v.kept for v in body) > 0.85 * len(body)
    assert sum(v.kept for v in verdicts) > 0.70 * len(verdicts)


def test_repeated_repository_docs_drop_every_second_copy_as_duplicate() -> None:
    texts = paragraphs("README.md", "tests/fixtures/markdown/architecture.md")
    once = run(texts)
    twice = run(texts + texts)
    assert twice[: len(texts)] == once
    assert all(v.reason is DropReason.DUPLICATE for v in twice[len(texts) :])
    assert drop_counts(twice)["duplicate"] == len(texts)
