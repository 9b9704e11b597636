"""Length-bucketed batches: neighbours in length share a batch, and every row comes back to its input's place."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardfuse.pipeline.embed.providers.length_buckets import in_input_order, length_batches, length_order


def test_batches_hold_neighbours_in_length() -> None:
    lengths = [200, 12, 256, 15, 90, 14, 250, 88]
    assert length_batches(lengths, 3) == [[1, 5, 3], [7, 4, 0], [6, 2]]
    # Each batch pads to its own longest: 15 + 200 + 256 tokens per row instead of 256 everywhere.
    assert [max(lengths[i] for i in batch) for batch in length_batches(lengths, 3)] == [15, 200, 256]


def test_equal_lengths_keep_their_order() -> None:
    assert length_order([5, 3, 5, 3]) == [1, 3, 0, 2]


@given(lengths=st.lists(st.integers(min_value=1, max_value=256), min_size=1, max_size=80),
       batch_size=st.integers(min_value=1, max_value=17))
def test_rows_return_to_their_inputs_place(lengths: list[int], batch_size: int) -> None:
    batches = length_batches(lengths, batch_size)
    assert all(len(batch) <= batch_size for batch in batches)
    # Each input's "vector" is its own position, computed batch by batch in bucket order.
    rows = [np.array([[float(i), float(lengths[i])] for i in batch], dtype=np.float32) for batch in batches]
    restored = in_input_order(rows, batches)
    np.testing.assert_array_equal(restored[:, 0], np.arange(len(lengths), dtype=np.float32))
    np.testing.assert_array_equal(restored[:, 1], np.asarray(lengths, dtype=np.float32))


def test_a_batch_with_a_row_too_few_is_refused() -> None:
    batches = length_batches([3, 1, 2], 2)
    rows = [np.zeros((2, 4), dtype=np.float32), np.zeros((0, 4), dtype=np.float32)]
    with pytest.raises(ValueError, match="batch 1 has 1 inputs but 0 rows"):
        in_input_order(rows, batches)


def test_positions_missing_or_repeated_are_refused() -> None:
    rows = [np.zeros((2, 4), dtype=np.float32)]
    with pytest.raises(ValueError, match="exactly once"):
        in_input_order(rows, [[0, 0]])
    with pytest.raises(ValueError, match="positive"):
        length_batches([1, 2], 0)
