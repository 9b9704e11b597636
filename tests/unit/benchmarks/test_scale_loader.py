"""The scale loader streams the same corpus the other scale benchmarks build whole."""

from __future__ import annotations

from itertools import islice

from tests.benchmarks import scale
from tests.benchmarks.scale_loader import iter_corpus


def test_the_streamed_corpus_is_the_scale_corpus_from_any_start() -> None:
    whole = scale.corpus(5_183 + 20)  # past one copy of SciFact: the second copy's first documents
    assert list(islice(iter_corpus(), len(whole))) == whole
    assert list(islice(iter_corpus(5_180), 10)) == whole[5_180:5_190]
    assert len({doc.text for doc in whole}) == len(whole)
