"""Metrics: counters and histograms defined once with prometheus_client, and each worker pool's /metrics."""
