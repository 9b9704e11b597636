"""The workers' Celery app: ``celery -A shardfuse.workers.celery_app:app worker -Q <queue>`` (and ``flower``).

Importing this module builds nothing. The app is built on first access to ``app`` — when Celery's
``-A`` option looks it up as the process starts, or when a task module registers its tasks — once per
process, from this process's settings (:func:`shardfuse.pipeline.config.handoff.process_settings`): the
file a launcher (``shardfuse up | worker | flower``) resolved and named in ``SHARDFUSE_RESOLVED_SETTINGS``,
else the TOML file and environment, for whoever runs ``celery -A`` by hand. Database pools and models are
created later still, in worker start-up signals (:mod:`shardfuse.workers.lifecycle`).
"""

from __future__ import annotations

import functools
import os

from celery import Celery

from shardfuse.pipeline.config.handoff import process_settings
from shardfuse.workers.app import create_app
from shardfuse.workers.lifecycle import connect_signals
from shardfuse.workers.observability import connect_observability


@functools.cache
def worker_app() -> Celery:
    """This process's worker app, with its start-up signals connected; built once, on first call."""
    app = create_app(process_settings(os.environ))
    connect_signals(app)
    connect_observability(app)
    return app


def __getattr__(name: str) -> Celery:
    # PEP 562: ``celery_app.app`` and ``from shardfuse.workers.celery_app import app`` land here.
    if name == "app":
        return worker_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
