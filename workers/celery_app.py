"""The workers' Celery app: ``celery -A workers.celery_app:app worker -Q <queue>``.

Importing this module reads settings and builds the app object only; database pools and models are
created in worker start-up signals (:mod:`workers.runtime`).
"""

from __future__ import annotations

from pipeline.settings import load_settings
from workers.app_factory import create_app
from workers.observability import connect_observability
from workers.runtime import connect_signals

app = create_app(load_settings())
connect_signals(app)
connect_observability(app)
