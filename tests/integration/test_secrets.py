"""A stack of its own with every secret set: Redis and PostgreSQL passwords (with characters a URL must
encode), API keys and a Flower password. The servers refuse clients without the passwords; no secret shows
in reprs, status, the recorded state, any file of the data dir but the workers' private settings file (logs
included), any process's command line, a worker's environment, task messages or Flower's pages."""

from __future__ import annotations

import base64
import json
import stat
import time
import urllib.error
import urllib.request
from base64 import b64encode
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import psutil
import psycopg
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from shardfuse.pipeline.config.handoff import RESOLVED_SETTINGS_ENV
from shardfuse.pipeline.config.redaction import secret_values, spellings
from shardfuse.workers.stack.addresses import StackAddresses
from shardfuse.workers.stack.celery_processes import flower_ready, worker_nodename
from shardfuse.workers.stack.errors import StackError
from shardfuse.workers.stack.layout import StackLayout
from shardfuse.workers.stack.redis_server import redis_ready
from tests.integration.conftest import Stack, running_stack
from tests.integration.ports import free_port

pytestmark = pytest.mark.integration

REDIS_PW = "Rd#7q!zx-SECRET-redis"
PG_PW = "Pg@9w/SECRET-pg"
SECRETS = {
    "redis": REDIS_PW, "postgres": PG_PW, "embedder": "sk-embedder-SECRET-4e1b",
    "context": "sk-context-SECRET-77aa", "expansion": "sk-expansion-SECRET-90c3", "flower": "flower-SECRET-3d2",
}  # fmt: skip


@pytest.fixture(scope="module")
def secured() -> Iterator[Stack]:
    redis_port, pg_port = free_port(), free_port()
    redis_url = f"redis://:{quote(REDIS_PW, safe='')}@127.0.0.1:{redis_port}"
    overrides = {
        "SHARDFUSE_EMBEDDER__PROVIDER": "hashing",
        "SHARDFUSE_BM25__REBUILD_DEBOUNCE_S": "0.2",
        "SHARDFUSE_SHARDS": "2",
        "SHARDFUSE_BROKER__URL": f"{redis_url}/0",
        "SHARDFUSE_BROKER__RESULT_BACKEND": f"{redis_url}/1",
        "SHARDFUSE_POSTGRES__DSN": f"postgresql://postgres:{quote(PG_PW, safe='')}@127.0.0.1:{pg_port}/shardfuse",
        "SHARDFUSE_EMBEDDER__API_KEY": SECRETS["embedder"],
        "SHARDFUSE_CONTEXT__API_KEY": SECRETS["context"],
        "SHARDFUSE_QUERY__EXPANSION__API_KEY": SECRETS["expansion"],
        "SHARDFUSE_FLOWER__PASSWORD": SECRETS["flower"],
    }
    with running_stack(overrides) as stack:
        yield stack


def _leaks(text: str | bytes) -> list[str]:
    """The names of the secrets ``text`` shows, in any spelling (plain or URL-encoded)."""
    data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape")
    return sorted(name for name, secret in SECRETS.items() if any(s.encode() in data for s in spellings(secret)))


def test_every_secret_is_known_to_the_redaction_helper(secured: Stack) -> None:
    assert set(secret_values(secured.settings)) == set(SECRETS.values())


def test_the_servers_refuse_clients_without_the_passwords_and_the_stack_works_with_them(secured: Stack) -> None:
    with secured.publisher() as publisher:
        publisher.write(zone="locked", path="vault.md", data=b"# Vault\n\nThe passwordprotectedterm document.\n")
    secured.wait()
    for mode in ("keyword", "semantic", "hybrid"):
        hits = secured.search("passwordprotectedterm", "locked", mode=mode)["results"]
        assert [h["path"] for h in hits][:1] == ["vault.md"], mode

    endpoint = StackAddresses.from_settings(secured.settings).redis
    for password in (None, "wrong"):
        client = redis.Redis(host=endpoint.host, port=endpoint.port, password=password, socket_timeout=5,
                             retry=Retry(NoBackoff(), 0))  # redis-py would retry the refusal with backoff
        with pytest.raises(redis.AuthenticationError):
            client.ping()
        client.close()
    assert redis.Redis.from_url(secured.settings.broker.url).ping()
    # The launcher's readiness check says what is wrong instead of waiting for nothing.
    with pytest.raises(StackError, match="refuses the password"):
        redis_ready(endpoint, password="wrong")
    with pytest.raises(StackError, match="wants a password"):
        redis_ready(endpoint)

    dsn = secured.settings.postgres.dsn
    port = StackAddresses.from_settings(secured.settings).postgres.endpoint.port
    for anonymous in (f"postgresql://postgres@127.0.0.1:{port}/shardfuse",
                      f"postgresql://postgres:wrong@127.0.0.1:{port}/shardfuse",
                      f"postgresql://postgres@localhost:{port}/postgres"):
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(anonymous, connect_timeout=5, passfile="/nonexistent/pgpass")
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_hba_file_rules WHERE type = 'host' AND "
                            "auth_method <> 'scram-sha-256'").fetchone() == (0,)
        verifier = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = 'postgres'").fetchone()
    assert verifier is not None and verifier[0].startswith("SCRAM-SHA-256$") and not _leaks(verifier[0])


def _queued(client: redis.Redis, queue: str) -> list[str]:
    """The messages waiting in ``queue``, each as its raw envelope plus its decoded body."""
    out = []
    for raw in client.lrange(queue, 0, -1):
        envelope = json.loads(raw)
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        out.append(text + base64.b64decode(envelope["body"]).decode())
    return out


def test_task_messages_carry_no_credentials(secured: Stack) -> None:
    """Ingest messages (as published) and embed messages (as the ingest pool sends them) hold events and
    documents, never a password or key."""
    from celery.signals import before_task_publish

    from shardfuse.workers.app import create_app
    from shardfuse.workers.names import Queue

    published: list[str] = []

    def record(body: Any = None, headers: Any = None, **_: Any) -> None:
        published.append(json.dumps([body, headers], default=str))

    control = create_app(secured.settings).control
    client = redis.Redis.from_url(secured.settings.broker.url)
    embed_pool = [worker_nodename(Queue.EMBED)]  # one addressee: the reply comes without waiting out the timeout
    assert control.cancel_consumer(Queue.EMBED.value, destination=embed_pool, reply=True, timeout=10)
    before_task_publish.connect(record, weak=False)
    try:
        with secured.publisher() as publisher:
            for i in range(3):
                publisher.write(zone="msgs", path=f"m{i}.txt", data=f"message body {i} msgcheckterm".encode(),
                                metadata={"team": "x"})
        embed_messages: list[str] = []
        for _ in range(600):  # the ingest pool turns them into embed messages, held while nobody consumes
            embed_messages = _queued(client, Queue.EMBED.value)
            if any("msgcheckterm" in message for message in embed_messages):
                break
            time.sleep(0.1)
    finally:
        before_task_publish.disconnect(record)
        assert control.add_consumer(Queue.EMBED.value, destination=embed_pool, reply=True, timeout=10)
        client.close()
    assert published and any("msgcheckterm" in m for m in embed_messages), (published, embed_messages)
    for message in published + embed_messages:
        assert not _leaks(message), message[:500]
    secured.wait()
    assert len(secured.search("msgcheckterm", "msgs", mode="keyword")["results"]) == 3


def worker_nodename_for(queue: str) -> str:
    from shardfuse.workers.names import Queue

    return worker_nodename(Queue(queue))


def _flower(url: str, *, auth: tuple[str, str] | None = None, method: str = "GET") -> tuple[int, str]:
    headers = {}
    if auth is not None:
        headers["Authorization"] = "Basic " + b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    request = urllib.request.Request(url, headers=headers, method=method, data=b"{}" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status), response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


def test_flower_wants_its_credentials_on_every_page_and_api(secured: Stack) -> None:
    base = secured.state.flower_url.rstrip("/")
    user, password = secured.settings.flower.user, SECRETS["flower"]
    pages = ["/", "/workers", "/tasks", "/broker", "/api/workers", "/api/workers?refresh=1", "/api/tasks",
             "/api/task/types", "/api/queues/length", f"/worker/{worker_nodename_for('ingest')}"]
    # Flower cannot inspect queues through our own Redis transport (workers/broker/transport.py): with the
    # credentials these two answer 404 "broker is not supported" rather than 200. Without them, 401 all the same.
    unsupported = {"/broker", "/api/queues/length"}
    for page in pages:
        assert _flower(base + page)[0] == 401, page
        assert _flower(base + page, auth=(user, password + "x"))[0] == 401, page
        assert _flower(base + page, auth=(user + "x", password))[0] == 401, page
        assert _flower(base + page, auth=(user, ""))[0] == 401, page
        assert _flower(base + page, auth=(user, "shardfuse"))[0] == 401, page  # the default password
        status, body = _flower(base + page, auth=(user, password))
        if page in unsupported and status == 404:
            assert "broker is not supported" in body, (page, body[:200])
        else:
            assert status == 200, (page, status)
    # Control and task APIs refuse anonymous callers too (they could run tasks or stop workers).
    for action in ("/api/task/send-task/shardfuse.search", "/api/worker/shutdown/ingest@nowhere"):
        assert _flower(base + action, method="POST")[0] == 401, action
    assert flower_ready(base + "/", user=user, password=password)
    assert not flower_ready(base + "/", user=user, password=password + "x")


def test_no_secret_shows_in_reprs_status_state_files_logs_processes_or_flower(secured: Stack) -> None:
    settings = secured.settings
    assert not _leaks(repr(settings)) and not _leaks(str(settings))
    text = secured.cli("status").stdout
    as_json = json.loads(secured.cli("status", "--json").stdout)
    assert as_json["broker_url"].startswith("redis://:***@127.0.0.1:") and "broker   redis://:***@" in text
    assert not _leaks(text) and not _leaks(json.dumps(as_json, default=str))
    again = secured.cli("up", "--timeout", "60").stdout  # prints the recorded addresses
    assert "nothing started" in again and "redis://:***@" in again and not _leaks(again)

    # Flower: the worker pages list app.conf (broker_url among them), the API the workers' stats and tasks.
    base = secured.state.flower_url.rstrip("/")
    auth = (settings.flower.user, SECRETS["flower"])
    pages = {page: _flower(base + page, auth=auth) for page in (
        "/api/workers?refresh=1", "/workers", "/broker", "/tasks", "/api/tasks",
        *(f"/worker/{worker_nodename_for(q)}" for q in ("ingest", "embed", "maintenance", "query")))}
    pages["/metrics (no credentials)"] = _flower(base + "/metrics")
    for page, (status, body) in pages.items():
        assert status in (200, 404) and not _leaks(body), (page, status, _leaks(body))
    workers = json.loads(pages["/api/workers?refresh=1"][1])
    shown = {conf.get("broker_url") for info in workers.values() for conf in [info.get("conf") or {}]}
    print("flower shows broker_url as", shown)
    assert shown and all(url is None or "127.0.0.1" in url for url in shown), shown

    # Every process on this machine: no command line holds a secret (Redis gets its password on stdin).
    for proc in psutil.process_iter(["pid", "cmdline"]):
        assert not _leaks(" ".join(proc.info["cmdline"] or [])), proc.info
    # The settings reach the workers as a file readable by their own user only (mode 0600), which their
    # environment names; the environment itself holds no secret. The scanner does find every secret in that
    # file, so its silence elsewhere means something.
    layout = StackLayout(settings.data_path)
    for name in ("worker-ingest", "worker-embed", "worker-maintenance", "worker-query"):
        worker_env = psutil.Process(secured.state.components[name].pid).environ()
        assert worker_env[RESOLVED_SETTINGS_ENV] == str(layout.settings_file), name
        assert not _leaks(json.dumps(worker_env)), (name, _leaks(json.dumps(worker_env)))
    assert stat.S_IMODE(layout.settings_file.stat().st_mode) == 0o600
    assert set(_leaks(layout.settings_file.read_bytes())) == set(SECRETS)

    # Every other file the stack wrote: logs, the recorded state, PostgreSQL's and Redis's data, Flower's db.
    banner = layout.log_file("worker-ingest").read_text()
    assert "transport:" in banner and "redis://:**@127.0.0.1" in banner  # Celery's banner masks it
    print("banner:", [line.strip() for line in banner.splitlines() if "transport:" in line or "results:" in line])
    checked = 0
    for path in sorted(settings.data_path.rglob("*")):
        if path.is_file() and not path.is_symlink() and not path.is_socket() and path != layout.settings_file:
            assert not _leaks(path.read_bytes()), (path, _leaks(path.read_bytes()))
            checked += 1
    assert checked > 20 and layout.state_file.exists() and any(layout.logs_dir.glob("*.log"))
    print("files checked:", checked, "status line:", text.splitlines()[0])
    assert "***" in layout.state_file.read_text()
