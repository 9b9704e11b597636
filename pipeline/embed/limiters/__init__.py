"""Backpressure on provider calls: per process and across every worker (Redis)."""
