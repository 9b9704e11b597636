"""``shardfuse rebuild-bm25``: what an operator runs after restoring PostgreSQL (docs/operations.md)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_fixed

from shardfuse.pipeline.index.lexical.manifest import read_manifest
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration


@retry(retry=retry_if_exception_type(OSError), stop=stop_after_delay(5), wait=wait_fixed(0.1), reraise=True)
def _lose(folder: Path) -> None:
    """Delete ``folder`` as a lost disk would; the maintenance worker may still be writing a file into it
    (seen once under make test's load: "Directory not empty"), so try again for a few seconds."""
    shutil.rmtree(folder)


def test_every_shard_gets_a_new_generation_rebuilt_from_postgres(stack: Stack) -> None:
    zone = f"rebuild-{uuid.uuid4().hex[:8]}"
    with stack.publisher() as publisher:
        for i in range(6):
            publisher.write(zone=zone, path=f"n{i}.txt", data=f"quokka note number {i}".encode())
    stack.wait()
    root = stack.settings.bm25_root
    before = {}
    for shard in range(stack.settings.shards):
        manifest = read_manifest(root, shard)
        assert manifest is not None
        before[shard] = manifest.generation
    # A lost BM25 folder (say a restore brought back PostgreSQL only): its generations are gone.
    _lose(root / "shard_0")
    out = stack.cli("rebuild-bm25")
    assert out.stdout.count("full rebuild sent") == stack.settings.shards
    stack.wait()
    for shard in range(stack.settings.shards):
        manifest = read_manifest(root, shard)
        assert manifest is not None and (shard == 0 or manifest.generation > before[shard])
    found = stack.search("quokka note", zone, mode="keyword", k=10)
    assert {r["path"] for r in found["results"]} == {f"n{i}.txt" for i in range(6)}


def test_a_shard_that_does_not_exist_is_refused(stack: Stack) -> None:
    out = stack.cli("rebuild-bm25", "--shard", "7", check=False)
    assert out.returncode == 2 and "no shard 7: shards are 0..1" in out.stderr
