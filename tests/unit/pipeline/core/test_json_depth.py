"""JSON from outside decoded within a nesting bound (shardfuse.pipeline.core.json_depth): counted without
recursion, refused before decoding, every refusal a ValueError."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfuse.pipeline.core.json_depth import MAX_DEPTH, TooDeepError, loads, nesting_depth


def _json() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=20)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(_json() | st.text())
def test_nesting_depth_counts_the_brackets_outside_strings(value: Any) -> None:
    assert nesting_depth(json.dumps(value)) == _depth(value)
    assert nesting_depth(json.dumps(value, ensure_ascii=False)) == _depth(value)


def test_nesting_depth_stops_past_its_limit_and_sees_no_brackets_in_strings() -> None:
    assert nesting_depth("[" * 10**6) > MAX_DEPTH
    assert nesting_depth(json.dumps(["[[[[", "\\", '"{{{', "]]"])) == 1


@settings(max_examples=200, deadline=None)
@given(_json())
def test_loads_decodes_what_json_decodes_within_the_bound(value: Any) -> None:
    text = json.dumps(value)
    assert loads(text) == json.loads(text)
    assert loads(text.encode()) == json.loads(text)
    for encoding in ("utf-8-sig", "utf-16", "utf-32"):  # as json.loads reads bytes: a BOM, or UTF-16 and -32
        assert loads(text.encode(encoding)) == json.loads(text.encode(encoding))


@pytest.mark.parametrize("text", [
    "[" * 100_000 + "]" * 100_000,  # json.loads raises RecursionError here
    '{"a":' * 5_000 + "1" + "}" * 5_000,
    "[" * 100_000,  # not even JSON: still refused for its depth, never decoded
])
def test_loads_refuses_deep_nesting_before_decoding(text: str) -> None:
    with pytest.raises(TooDeepError, match=f"nests deeper than {MAX_DEPTH} levels"):
        loads(text)


def test_loads_holds_to_its_limit() -> None:
    assert loads("[" * 5 + "]" * 5, limit=5) == [[[[[]]]]]
    with pytest.raises(TooDeepError, match="nests deeper than 4 levels"):
        loads("[" * 5 + "]" * 5, limit=4)


@pytest.mark.parametrize("data", [b"\xff{}", b'{"a": ', "", "{'a': 1}"])
def test_every_other_refusal_is_a_value_error(data: str | bytes) -> None:
    with pytest.raises(ValueError):
        loads(data)
