"""Which shard a document lives on."""

from __future__ import annotations

import hashlib


def shard_for(zone: str, path: str, shards: int) -> int:
    """``hash(zone, path) % shards`` with a hash that is stable across processes and Python versions
    (the built-in ``hash`` is salted per process, so it cannot place documents)."""
    if shards < 1:
        raise ValueError("shards must be at least 1")
    digest = hashlib.blake2b(f"{zone}\x00{path}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards
