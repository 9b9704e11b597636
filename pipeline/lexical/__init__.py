"""Per-shard BM25 indexes on bm25s: build a generation, publish it with an atomic manifest switch, search
it from query workers with mmap and a per-zone weight mask.

Nothing here imports Celery; the maintenance and query workers call these functions.
"""

from pipeline.lexical.builder import build_shard_index
from pipeline.lexical.hits import LexicalHit
from pipeline.lexical.manifest import ShardManifest, read_manifest
from pipeline.lexical.reader import LexicalShardReader
from pipeline.lexical.tokenizer import Tokenizer, split_identifier

__all__ = [
    "LexicalHit",
    "LexicalShardReader",
    "ShardManifest",
    "build_shard_index",
    "read_manifest",
    "Tokenizer",
    "split_identifier",
]
