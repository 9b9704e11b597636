"""A shard's vector search rows as hits: pgvector's iterative scan returns them in a relaxed order."""

from __future__ import annotations

from shardfuse.pipeline.index.store.reads import vector_hits


def test_rows_of_a_relaxed_order_scan_come_back_best_first_and_ties_in_the_servers_order() -> None:
    # The statement no longer sorts (pipeline/index/store/nearest.py): the hits must be sorted here. Equal
    # scores keep the order the server sent them in, as an exact search's ORDER BY gives them.
    rows = [("b", 0.80), ("a", 0.91), ("c", 0.80), ("d", 0.95), ("a2", 0.80)]

    hits = vector_hits(rows)

    assert [(hit.chunk_id, hit.score) for hit in hits] == [
        ("d", 0.95), ("a", 0.91), ("b", 0.80), ("c", 0.80), ("a2", 0.80)]


def test_a_row_without_a_vector_in_the_column_is_never_a_hit() -> None:
    assert [hit.chunk_id for hit in vector_hits([("kept", 0.5), ("left-the-model", None)])] == ["kept"]
