"""Coordination between workers through Redis: document leases, liveness, the chunk registry, the deferred
HNSW build schedule, and the one translation of Redis errors into ours."""
