"""Retrieval evaluation: BEIR-layout datasets and ranking metrics, as pure functions."""

from shardfuse.query.evaluation.beir import BeirDataset, load_beir
from shardfuse.query.evaluation.metrics import mrr_at_k, ndcg_at_k, percentile, recall_at_k

__all__ = ["BeirDataset", "load_beir", "mrr_at_k", "ndcg_at_k", "percentile", "recall_at_k"]
