"""A worker's shutdown closes every connection its life cycle opened (``shardfuse.workers.lifecycle``).

A maintenance worker's delivery watch holds a Redis client, and its BM25 rebuild watchdog a PostgreSQL
connection per database; the runtime holds the stores' pools. On ``worker_shutdown`` they are all closed,
before the process exits: PostgreSQL sees each session end, not a socket dropped by a dying process.

The worker's signals are sent in a process of their own (Celery's signals are global to a process), against
the session's stack, and the process counts its own TCP connections to Redis and PostgreSQL.
"""

from __future__ import annotations

import json
import subprocess
import sys
from urllib.parse import urlsplit

import pytest

from tests.integration.conftest import REPO, Stack

pytestmark = pytest.mark.integration

_WORKER = """
import json, sys, time
import psutil
from celery import signals
from shardfuse.workers.celery_app import worker_app

app = worker_app()
app.amqp.queues.select(["maintenance"])
ports = {int(p) for p in sys.argv[1:]}

def connections():
    return sorted(c.raddr.port for c in psutil.Process().net_connections("tcp")
                  if c.raddr and c.status == psutil.CONN_ESTABLISHED and c.raddr.port in ports)

class Worker:  # what the receivers read of their sender: this app's worker, a thread pool warming up in-process
    app = app
    pool = None

signals.worker_init.send(sender=Worker())
signals.worker_ready.send(sender=Worker())  # returns once the watch has started and the runtime is warm
time.sleep(3 * app.shardfuse_runtime.settings.delivery.heartbeat_s)  # the watchdog has read the shards' lag
during = connections()
signals.worker_shutdown.send(sender=Worker())
print(json.dumps({"during": during, "after": connections()}))
"""


def test_a_maintenance_worker_s_shutdown_leaves_no_connection_open(stack: Stack) -> None:
    redis_port = urlsplit(stack.settings.broker.url).port
    pg_port = urlsplit(stack.settings.postgres.dsn).port
    proc = subprocess.run([sys.executable, "-c", _WORKER, str(redis_port), str(pg_port)], env=stack.env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    # While it runs, the worker talks to both (the watch and the watchdog at least).
    assert redis_port in seen["during"] and pg_port in seen["during"], seen
    assert seen["after"] == [], f"connections left open after shutdown (ports): {seen['after']}"
