"""Coordination between workers through Redis: document leases, liveness, the chunk registry."""
