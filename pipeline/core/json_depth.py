"""JSON from outside the process, decoded only when it nests within a bound.

Python's JSON decoder recurses once per level of nesting and raises ``RecursionError`` near a thousand levels
(sooner on a deep stack): a few kilobytes of ``[`` in a request body, a ``metadata`` parameter, a broker message
or a model's reply would otherwise end in an internal error, or kill a worker. :func:`nesting_depth` counts
the levels without recursing, so such input is refused with a one-line reason before it is decoded.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

# Deeper than this is refused. Our own messages and requests nest fewer than 10 levels.
MAX_DEPTH = 64

_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
_STEP = np.zeros(256, dtype=np.int8)  # byte -> +1 (opens), -1 (closes)
_STEP[list(b"[{")], _STEP[list(b"]}")] = 1, -1
_DEPTH_CHUNK = 1 << 20


class TooDeepError(ValueError):
    """JSON nested deeper than the bound; its text reads after the thing's name ("… nests deeper than …")."""


def nesting_depth(text: str, *, limit: int = MAX_DEPTH) -> int:
    """How deep the brackets of JSON ``text`` nest, counted without recursion; stops early (returning a
    value above ``limit``) once ``limit`` is passed. Exact for valid JSON; for invalid JSON an estimate (the
    decoder then fails on the syntax). numpy's running sum keeps 64 MiB of brackets to a fraction of a second
    (a Python loop takes seconds)."""
    # Outside the strings: drop the escaped backslashes, then the escaped quotes, and every other piece
    # between quotes is a string. Then keep only the brackets (all of it at C speed).
    unescaped = text.replace("\\\\", "").replace('\\"', "")
    outside = "".join(unescaped.split('"')[0::2]).encode("utf-8", "surrogatepass")
    steps = _STEP[np.frombuffer(outside.translate(None, _NOT_BRACKETS), dtype=np.uint8)]
    depth, deepest = 0, 0
    # A running sum, a chunk at a time, stopping at the first chunk past the limit.
    for start in range(0, len(steps), _DEPTH_CHUNK):
        running = np.cumsum(steps[start:start + _DEPTH_CHUNK], dtype=np.int64) + depth
        deepest = max(deepest, int(running.max()))
        if deepest > limit:
            break
        depth = int(running[-1])
    return deepest


def loads(data: str | bytes | bytearray, *, limit: int = MAX_DEPTH) -> Any:
    """``json.loads`` of ``data``, refusing JSON nested deeper than ``limit`` with :class:`TooDeepError` before
    decoding it. Bytes are decoded as ``json.loads`` decodes them (UTF-8, a leading BOM dropped; UTF-16 or -32).
    Every refusal is a ``ValueError``: bytes that do not decode (``UnicodeDecodeError``), not JSON
    (``json.JSONDecodeError``) or too deep."""
    text = data if isinstance(data, str) else bytes(data).decode(json.detect_encoding(data), "surrogatepass")
    if (depth := nesting_depth(text, limit=limit)) > limit:
        raise TooDeepError(f"nests deeper than {limit} levels ({depth} or more)")
    try:
        return json.loads(text)
    except RecursionError:  # invalid JSON whose depth was underestimated: still refused, never raised as is
        raise TooDeepError(f"nests deeper than {limit} levels") from None
