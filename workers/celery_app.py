"""The workers' Celery app: ``celery -A shardfuse.workers.celery_app:app worker -Q <queue>``.

Importing this module reads settings and builds the app object only; database pools and models are
created in worker start-up signals (:mod:`shardfuse.workers.runtime`).
"""

from __future__ import annotations

from shardfuse.pipeline.config.settings import load_settings
from shardfuse.workers.app import create_app
from shardfuse.workers.observability import connect_observability
from shardfuse.workers.runtime import connect_signals

app = create_app(load_settings())
connect_signals(app)
connect_observability(app)
