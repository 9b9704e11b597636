"""Metrics every process records."""
