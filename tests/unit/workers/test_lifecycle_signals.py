"""A worker app's life cycle answers only its own worker's signals (shardfuse.workers.lifecycle).

Celery's worker signals are global to a process. Another app's worker started in a process that has also built
ours (a test's in-thread worker, an application's own Celery app) sends them too, and must not start our
runtime's warm-up against our settings' stores. Run in a process of its own, for the same reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO

_OTHER_APPS_WORKER = """
import json, threading
from celery import Celery
from celery.contrib.testing.worker import start_worker
from shardfuse.workers.celery_app import worker_app

ours = worker_app()  # built and connected, as importing a task module does
other = Celery("someone-elses", broker="memory://", backend="cache+memory://", set_as_current=False)
with start_worker(other, pool="solo", perform_ping_check=False):  # worker_init, worker_process_init, shutdown
    threads = sorted(t.name for t in threading.enumerate())
print(json.dumps({"readiness": ours.shardfuse_runtime.readiness(), "threads": threads}))
"""


def test_another_apps_worker_in_the_same_process_does_not_start_ours(tmp_path: Path) -> None:
    env = {**os.environ, "SHARDFUSE_DATA_DIR": str(tmp_path)}  # nothing of a real stack's, whatever runs here
    proc = subprocess.run([sys.executable, "-c", _OTHER_APPS_WORKER], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["readiness"] == {"ready": None}, seen  # our runtime was never built in this process
    assert "shardfuse-warm-up" not in seen["threads"], seen
    assert "not ready yet" not in proc.stderr, proc.stderr[-2000:]
