"""Which worker Celery's signals speak of: this app's, or another app's started in the same process.

Celery's worker signals are global to a process. Another app's worker started in a process that built ours (a
test's in-thread worker, an application's own Celery app; importing a task module builds our app) sends them
too, and only this app's worker may start or stop what this app owns (its runtime, delivery watch and metrics
endpoint). Its ``worker_init`` marks the process as this app's; a prefork child inherits the mark.
"""

from __future__ import annotations

import threading
from typing import Any

from celery import Celery


class OwnWorker:
    """This app's mark on the process, set by its worker's ``worker_init``."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._marked = threading.Event()

    def sent_by_ours(self, sender: Any) -> bool:
        """Whether a worker signal's ``sender`` (the worker) is this app's."""
        return getattr(sender, "app", None) is self.app

    def mark_if_ours(self, sender: Any) -> bool:
        """At ``worker_init``: mark the process if ``sender`` is this app's worker; whether it is."""
        if not self.sent_by_ours(sender):
            return False
        self._marked.set()
        return True

    def stopping(self, sender: Any) -> bool:
        """Whether a shutdown signal is this app's to act on: its worker runs here, and the signal is its worker's
        (``worker_shutdown``) or names no worker (``worker_process_shutdown``, sent in a pool child)."""
        return self.runs_here and (sender is None or self.sent_by_ours(sender))

    @property
    def runs_here(self) -> bool:
        """Whether this app's worker runs in this process (or in the parent it was forked from)."""
        return self._marked.is_set()
