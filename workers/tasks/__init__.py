"""Celery tasks, one module per queue. Each parses its message, calls ``pipeline/`` or ``query/``, and
translates errors into retry or dead letter."""
