"""Core types every stage shares: events, documents and chunks, sharding, token counting, errors."""
