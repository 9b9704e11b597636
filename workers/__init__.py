"""shardfuse runtime: the Celery app, task modules per queue, the CLI and the embedded stack."""
