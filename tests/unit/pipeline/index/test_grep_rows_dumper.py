"""The grep blocks' int4[] columns are dumped by numpy (shardfuse.pipeline.index.store.grep_store.Int4ArrayDumper):
the bytes must be exactly what psycopg's own int4[] dumper sends for the same values."""

from __future__ import annotations

import numpy as np
import pytest
from psycopg import pq
from psycopg.adapt import PyFormat, Transformer

from shardfuse.pipeline.index.store.grep_blocks import block_gram_array, block_grams
from shardfuse.pipeline.index.store.grep_store import Int4ArrayDumper

INT4_ARRAY = 1007


def _psycopg_bytes(values: list[int]) -> bytes:
    """What a COPY whose column is typed int4[] (``set_types``) sends with psycopg's own dumpers."""
    transformer = Transformer()
    transformer.set_dumper_types([INT4_ARRAY], pq.Format.BINARY)
    (dumped,) = transformer.dump_sequence([values], [PyFormat.BINARY])
    assert dumped is not None
    return bytes(dumped)


@pytest.mark.parametrize("values", [[-2_000_000_000, 0, 1, 6_381_921, 2**24 - 1], [7], []],
                         ids=["grams", "one", "empty"])
def test_the_numpy_dumper_sends_what_psycopg_sends(values: list[int]) -> None:
    ours = Int4ArrayDumper(list)
    assert ours.dump(values) == _psycopg_bytes(values)
    assert ours.dump(np.asarray(values, dtype=np.int32)) == _psycopg_bytes(values)


def test_a_block_row_carries_the_same_grams_as_an_array() -> None:
    text = "def parse(Kelvin \u212a):\n    return 'ÄÖ' * 3\n"
    assert block_gram_array(text, "zone").tolist() == block_grams(text, "zone")
    assert Int4ArrayDumper(list).dump(block_gram_array(text, "zone")) == _psycopg_bytes(block_grams(text, "zone"))


def test_a_nested_list_is_refused() -> None:
    with pytest.raises(ValueError, match="flat list"):
        Int4ArrayDumper(list).dump([[1, 2], [3, 4]])
