"""shardfuse indexing domain, one subpackage per stage: ``config``, ``core``, ``ingest``, ``embed``, ``index``,
``storage``, ``coordination``, ``observability``, ``admin`` (see docs/architecture.md).

Nothing in this package imports Celery: ``shardfuse.workers`` wires these functions to queues.
"""
