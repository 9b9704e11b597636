"""Token-aware packing of embedding inputs: limits, exactly-once, order, and mapping answers back."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfuse.pipeline.embed.packing import Batch, PackItem, PackLimits, pack, unpack


def _items(*tokens: int) -> list[PackItem[int]]:
    return [PackItem(key=i, tokens=t) for i, t in enumerate(tokens)]


def _keys(batches: list[Batch[int]]) -> list[tuple[int, ...]]:
    return [b.keys for b in batches]


# -- hand-checked examples -----------------------------------------------------------------------------


def test_input_limit_cuts_batches() -> None:
    batches = pack(_items(1, 1, 1, 1, 1), PackLimits(max_inputs=2, max_tokens=100))
    assert _keys(batches) == [(0, 1), (2, 3), (4,)]
    assert [b.start for b in batches] == [0, 2, 4]
    assert [b.tokens for b in batches] == [2, 2, 1]


def test_token_limit_cuts_batches() -> None:
    batches = pack(_items(6, 4, 1, 9, 10, 3), PackLimits(max_inputs=10, max_tokens=10))
    # 6+4=10 fits exactly; 1+9=10; 10 alone; 3.
    assert _keys(batches) == [(0, 1), (2, 3), (4,), (5,)]
    assert [b.tokens for b in batches] == [10, 10, 10, 3]


def test_an_earlier_batch_is_never_reopened() -> None:
    # A gap-filling packer would put item 2 (1 token) into batch 0; sequential packing keeps input order.
    batches = pack(_items(8, 5, 1), PackLimits(max_inputs=10, max_tokens=10))
    assert _keys(batches) == [(0,), (1, 2)]


def test_document_chunks_stay_together() -> None:
    items = [PackItem(key=(doc, ordinal), tokens=3) for doc in ("a", "b", "c") for ordinal in range(2)]
    batches = pack(items, PackLimits(max_inputs=4, max_tokens=12))
    assert [b.keys for b in batches] == [(("a", 0), ("a", 1), ("b", 0), ("b", 1)), (("c", 0), ("c", 1))]


def test_empty_input_gives_no_batches() -> None:
    assert pack([], PackLimits(max_inputs=1, max_tokens=1)) == []


def test_zero_token_items_are_bounded_by_input_count() -> None:
    assert _keys(pack(_items(0, 0, 0), PackLimits(max_inputs=2, max_tokens=1))) == [(0, 1), (2,)]


# -- errors --------------------------------------------------------------------------------------------


def test_item_larger_than_a_request_is_refused_with_its_key() -> None:
    with pytest.raises(ValueError, match=r"item 1 \('b'\) has 11 tokens.*\(10\)"):
        pack([PackItem("a", 1), PackItem("b", 11)], PackLimits(max_inputs=5, max_tokens=10))


def test_negative_tokens_and_repeated_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        pack([PackItem("a", -1)], PackLimits(max_inputs=5, max_tokens=10))
    with pytest.raises(ValueError, match="repeats the key 'a'"):
        pack([PackItem("a", 1), PackItem("a", 1)], PackLimits(max_inputs=5, max_tokens=10))


@pytest.mark.parametrize(("max_inputs", "max_tokens"), [(0, 10), (10, 0), (-1, 5)])
def test_limits_must_be_positive(max_inputs: int, max_tokens: int) -> None:
    with pytest.raises(ValueError, match="must be at least 1"):
        PackLimits(max_inputs=max_inputs, max_tokens=max_tokens)


def test_unpack_maps_rows_to_keys() -> None:
    batches = pack([PackItem("x", 1), PackItem("y", 1), PackItem("z", 1)], PackLimits(max_inputs=2, max_tokens=9))
    vectors = [np.array([[1, 0], [0, 1]], dtype=np.float32), np.array([[2, 2]], dtype=np.float32)]
    mapped = unpack(batches, vectors)
    assert list(mapped) == ["x", "y", "z"]
    assert mapped["y"].tolist() == [0.0, 1.0] and mapped["z"].tolist() == [2.0, 2.0]


def test_unpack_refuses_a_batch_with_a_missing_or_extra_vector() -> None:
    batches = pack(_items(1, 1, 1), PackLimits(max_inputs=2, max_tokens=9))
    short = [np.zeros((1, 4), dtype=np.float32), np.zeros((1, 4), dtype=np.float32)]
    with pytest.raises(ValueError, match=r"batch 0 \(items 0..1\) sent 2 inputs but got 1 vectors"):
        unpack(batches, short)
    extra = [np.zeros((2, 4), dtype=np.float32), np.zeros((2, 4), dtype=np.float32)]
    with pytest.raises(ValueError, match="batch 1 .* sent 1 inputs but got 2 vectors"):
        unpack(batches, extra)


def test_unpack_refuses_a_missing_batch() -> None:
    batches = pack(_items(1, 1, 1), PackLimits(max_inputs=2, max_tokens=9))
    with pytest.raises(ValueError, match="2 batches but 1 answers"):
        unpack(batches, [np.zeros((2, 4), dtype=np.float32)])


# -- properties ----------------------------------------------------------------------------------------

limits_st = st.builds(PackLimits, max_inputs=st.integers(1, 12), max_tokens=st.integers(1, 60))


@st.composite
def items_and_limits(draw: st.DrawFn) -> tuple[list[PackItem[int]], PackLimits]:
    limits = draw(limits_st)
    tokens = draw(st.lists(st.integers(0, limits.max_tokens), max_size=80))
    return _items(*tokens), limits


@settings(max_examples=300, deadline=None)
@given(items_and_limits())
def test_batches_respect_both_limits(case: tuple[list[PackItem[int]], PackLimits]) -> None:
    items, limits = case
    for batch in pack(items, limits):
        assert 1 <= len(batch) <= limits.max_inputs
        assert batch.tokens == sum(items[k].tokens for k in batch.keys) <= limits.max_tokens


@settings(max_examples=300, deadline=None)
@given(items_and_limits())
def test_every_item_once_in_input_order(case: tuple[list[PackItem[int]], PackLimits]) -> None:
    items, limits = case
    batches = pack(items, limits)
    flat = [k for b in batches for k in b.keys]
    assert flat == [item.key for item in items]  # exactly once, and order kept within and across batches
    assert all(b.keys == tuple(range(b.start, b.start + len(b))) for b in batches)  # contiguous runs


@settings(max_examples=300, deadline=None)
@given(items_and_limits())
def test_a_batch_is_closed_only_when_the_next_item_does_not_fit(
    case: tuple[list[PackItem[int]], PackLimits],
) -> None:
    items, limits = case
    batches = pack(items, limits)
    for batch, following in zip(batches, batches[1:], strict=False):
        nxt = items[following.start]
        assert len(batch) == limits.max_inputs or batch.tokens + nxt.tokens > limits.max_tokens


@settings(max_examples=200, deadline=None)
@given(items_and_limits(), st.integers(1, 8))
def test_unpack_round_trips(case: tuple[list[PackItem[int]], PackLimits], dims: int) -> None:
    items, limits = case
    batches = pack(items, limits)
    # Each item's vector encodes its key, so a shifted row would show.
    answers = [np.array([[k] * dims for k in b.keys], dtype=np.float32).reshape(len(b), dims) for b in batches]
    mapped = unpack(batches, answers)
    assert list(mapped) == [item.key for item in items]
    assert all(vector.tolist() == [float(key)] * dims for key, vector in mapped.items())


@settings(max_examples=100, deadline=None)
@given(limits_st, st.data())
def test_any_oversize_item_is_refused(limits: PackLimits, data: st.DataObject) -> None:
    tokens = data.draw(st.lists(st.integers(0, limits.max_tokens), max_size=20))
    position = data.draw(st.integers(0, len(tokens)))
    tokens.insert(position, limits.max_tokens + data.draw(st.integers(1, 100)))
    with pytest.raises(ValueError, match=f"item {position} "):
        pack(_items(*tokens), limits)
