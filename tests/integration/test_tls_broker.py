"""A ``rediss://`` broker gets our transport (shardfuse.workers.broker.transport.TlsTransport): the atomic
receive and the envelope check over TLS, and verified TLS even when the URL names no certificate options.

Debian's ``redis-server`` (built with TLS; ``make install`` installs it) serves TLS only, on a loopback port,
with a certificate the test signs with a CA it makes (the ``openssl`` command)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue

from shardfuse.workers.app import broker_transport
from shardfuse.workers.broker import inbox as broker_inbox
from shardfuse.workers.broker.inbox import INBOXES_KEY, UNREADABLE_KEY
from shardfuse.workers.broker.transport import TLS_TRANSPORT
from tests.integration.conftest import REPO
from tests.integration.ports import free_port

pytestmark = pytest.mark.integration

REDIS_SERVER = Path("/usr/bin/redis-server")
QUEUE = "tls-test"
OPTIONS = {"priority_steps": [0]}

# A real Celery worker (solo pool) of the app create_app builds for a rediss:// broker, running one task.
_WORKER = """
import sys
from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers.app import create_app

url = sys.argv[1]
app = create_app(Settings(broker={"url": url, "result_backend": url.replace("/0?", "/1?")}))
app.conf.include = []

@app.task(name="tls.echo")
def echo(value):
    return {"value": value, "transport": app.conf.broker_transport}

app.worker_main(["worker", "--pool=solo", "-Q", sys.argv[2], "--without-mingle", "--without-gossip",
                 "--without-heartbeat", "--loglevel=WARNING"])
"""

# A consumer that dies (os._exit, as kill -9 would) once the broker handed it a message, before recording it.
_DIES_ON_RECEIPT = """
import os, sys
from kombu import Connection, Queue
from shardfuse.workers.broker import transport

def die(self, message, delivery_tag):
    print("received", flush=True)
    os._exit(0)

transport.QoS.append = die
with Connection(sys.argv[1], transport=transport.TLS_TRANSPORT, transport_options={"priority_steps": [0]}) as conn:
    with conn.Consumer(Queue(sys.argv[2], routing_key=sys.argv[2]), accept=["json"], callbacks=[]):
        print("ready", flush=True)
        while True:
            conn.drain_events(timeout=60)
"""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _certificates(directory: Path) -> None:
    """ca.crt, and server.crt/server.key for 127.0.0.1 signed by it."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=shardfuse test CA",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=directory)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
             "-out", "server.csr", cwd=directory)
    (directory / "san.cnf").write_text("subjectAltName = IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "1", "-extfile", "san.cnf", "-out", "server.crt", cwd=directory)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, redis.Redis]]:
    """(a verified rediss:// URL of database 0, the CA file, a verified client)."""
    if not REDIS_SERVER.exists() or shutil.which("openssl") is None:
        pytest.skip(f"needs Debian's TLS-capable {REDIS_SERVER} and openssl (`make install` installs them)")
    directory: Path = tmp_path_factory.mktemp("tls-redis")
    _certificates(directory)
    port = free_port()
    process = subprocess.Popen([str(REDIS_SERVER), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                                "--tls-cert-file", "server.crt", "--tls-key-file", "server.key",
                                "--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no",
                                "--dir", str(directory), "--save", "", "--appendonly", "no"],
                               cwd=directory, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ca = directory / "ca.crt"
    client = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca), ssl_cert_reqs="required",
                         socket_connect_timeout=2)
    try:
        for _ in range(200):
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    break
            time.sleep(0.05)
        yield f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={ca}", ca, client
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def client(tls: tuple[str, Path, redis.Redis]) -> redis.Redis:
    tls[2].flushall()
    return tls[2]


def test_a_rediss_broker_gets_our_transport() -> None:
    assert broker_transport("rediss://h:6380/0") == TLS_TRANSPORT


def test_a_celery_worker_receives_through_our_inbox_over_tls(tls: tuple[str, Path, redis.Redis],
                                                             client: redis.Redis) -> None:
    from celery import Celery

    url = tls[0]
    worker = subprocess.Popen([sys.executable, "-c", _WORKER, url, QUEUE], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        caller = Celery(broker=url, backend=url.replace("/0?", "/1?"), set_as_current=False)
        caller.conf.update(broker_transport=broker_transport(url), broker_transport_options=OPTIONS)
        client.lpush(QUEUE, b'{"body": "e30=", "headers": {}}')  # hostile first: set aside, not looped
        result = caller.send_task("tls.echo", args=None, kwargs={"value": 42}, queue=QUEUE)
        answer: dict[str, Any] = result.get(timeout=60)
        assert answer == {"value": 42, "transport": TLS_TRANSPORT}
        queues = {json.loads(v)["queue"] for v in client.hvals(INBOXES_KEY)}
        assert QUEUE in queues  # the worker received with BLMOVE into its inbox
        [record] = [json.loads(raw) for raw in client.lrange(UNREADABLE_KEY, 0, -1)]
        assert record["queue"] == QUEUE and "has no 'content-type'" in record["reason"]
        assert worker.poll() is None  # the same worker process throughout
    finally:
        worker.kill()
        output = worker.communicate(timeout=30)[0]
    assert "Traceback" not in output, output


def test_a_consumer_killed_on_receipt_over_tls_leaves_the_message_in_its_inbox(
        tls: tuple[str, Path, redis.Redis], client: redis.Redis) -> None:
    url = tls[0]
    consumer = subprocess.Popen([sys.executable, "-c", _DIES_ON_RECEIPT, url, QUEUE], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert consumer.stdout is not None and consumer.stdout.readline().strip() == "ready"
        with Connection(url, transport=TLS_TRANSPORT, transport_options=OPTIONS) as conn:
            Producer(conn.channel(), exchange=Exchange(""), serializer="json").publish(
                {"n": 1}, routing_key=QUEUE, declare=[Queue(QUEUE, routing_key=QUEUE)])
        assert consumer.stdout.readline().strip() == "received"
        consumer.wait(timeout=30)
    finally:
        if consumer.poll() is None:
            consumer.kill()
    [inbox] = [k.decode() for k in client.scan_iter(broker_inbox.INBOX_PREFIX + "*")]
    assert client.llen(inbox) == 1 and client.llen(QUEUE) == 0
    assert broker_inbox.release_dead_inboxes(client, grace_s=60, now=time.time() + 61) == 1
    assert client.llen(QUEUE) == 1


def test_a_rediss_url_without_certificate_options_is_verified_not_trusted(
        tls: tuple[str, Path, redis.Redis]) -> None:
    bare = tls[0].split("?", 1)[0]  # no ssl_* options: kombu's own transport would not verify at all
    with Connection(bare, transport=TLS_TRANSPORT, transport_options=OPTIONS) as conn, \
            pytest.raises(Exception, match="certificate verify failed"):
        conn.ensure_connection(max_retries=1)
        conn.default_channel.client.ping()
