"""Per-shard BM25 indexes on bm25s: build a generation, publish it with an atomic manifest switch, search
it from query workers with mmap and a per-zone weight mask.

Nothing here imports Celery; the maintenance and query workers call these functions.
"""

from shardfuse.pipeline.index.lexical.builder import build_shard_index
from shardfuse.pipeline.index.lexical.hits import LexicalHit
from shardfuse.pipeline.index.lexical.manifest import ShardManifest, read_manifest
from shardfuse.pipeline.index.lexical.reader import LexicalShardReader
from shardfuse.pipeline.index.lexical.tokenizer import Tokenizer, split_identifier

__all__ = [
    "LexicalHit",
    "LexicalShardReader",
    "ShardManifest",
    "build_shard_index",
    "read_manifest",
    "Tokenizer",
    "split_identifier",
]
