"""shardfuse indexing domain: events, CAS, decoding, chunking, embeddings and shard stores.

Nothing in this package imports Celery: ``workers/`` wires these functions to queues.
"""
