"""The embedded stack's life cycle: start Redis and PostgreSQL + pgvector, start again (a no-op), stop; and
the whole stack's workers and Flower running with exactly the settings ``up`` was given.

Runs on free ports in a temporary data dir, independently of the session-wide stack in conftest.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
import redis

from shardfuse import SearchClient, connect_publisher
from shardfuse.pipeline.config.handoff import RESOLVED_SETTINGS_ENV, read_settings_file
from shardfuse.pipeline.config.settings import Settings, load_settings
from shardfuse.pipeline.config.stack_secrets import with_stack_secrets
from shardfuse.pipeline.core.sharding import shard_for
from shardfuse.workers import monitor
from shardfuse.workers.broker.serialization import control_app
from shardfuse.workers.names import Queue
from shardfuse.workers.stack import StackError, StackState, down, read_state, up
from shardfuse.workers.stack import processes as stack_processes
from shardfuse.workers.stack.celery_processes import worker_nodename
from shardfuse.workers.stack.layout import StackLayout
from tests.integration.ports import free_port

pytestmark = pytest.mark.integration

SERVERS = {"redis", "postgres"}


# Below Linux's ephemeral range (32768-60999): a port the kernel picks for bind(0) or for an outgoing
# connection elsewhere (a concurrent test session) can then never collide with ours.
def _tree(pid: int) -> set[int]:
    """``pid`` and its descendants (postgres backends, pool children)."""
    try:
        proc = psutil.Process(pid)
        return {pid, *(child.pid for child in proc.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def _running(pids: set[int]) -> set[int]:
    return {pid for pid in pids if not stack_processes.is_gone(pid)}


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data dir outside pytest's tmp root.

    Under root, PostgreSQL runs as the ``pgserver`` user, which must traverse every parent of PGDATA. Each
    pytest session resets ``/tmp/pytest-of-root`` to mode 0700, so a concurrent session would lock the
    server out of a data dir kept there.
    """
    path = Path(tempfile.mkdtemp(prefix="shardfuse-stack-test-"))
    yield path / "data"
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def servers_settings(data_dir: Path) -> Iterator[Settings]:
    """Settings for a private stack; whatever a failing test left running is stopped afterwards."""
    redis_port, pg_port = free_port(), free_port()
    settings = Settings(
        data_dir=data_dir,
        broker={"url": f"redis://127.0.0.1:{redis_port}/0", "result_backend": f"redis://127.0.0.1:{redis_port}/1"},
        postgres={"dsn": f"postgresql://postgres@127.0.0.1:{pg_port}/sf_lifecycle"},
        stack={"flower_port": free_port(), "api_port": free_port()},
    )
    yield settings
    down(settings, timeout=10)


def test_servers_start_once_answer_and_stop_without_leftovers(servers_settings: Settings) -> None:
    lines: list[str] = []
    state = up(servers_settings, only=SERVERS, progress=lines.append, timeout=60)

    assert set(state.alive()) == SERVERS
    assert read_state(servers_settings) == state
    live = with_stack_secrets(servers_settings)  # the passwords up generated for the data dir
    endpoint = redis.Redis.from_url(live.broker.url)
    try:
        assert endpoint.ping()
    finally:
        endpoint.close()
    with psycopg.connect(live.postgres.dsn) as conn:
        row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        assert row is not None and row[0]
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        # pgvector really works, not just its catalog entry.
        assert conn.execute("SELECT '[3,4]'::vector <-> '[0,0]'::vector").fetchone() == (5.0,)
    assert any(line.startswith("redis: starting") for line in lines)
    assert any(line.startswith("postgres: starting") for line in lines)

    # A second call finds both alive and starts nothing.
    pids = set().union(*(_tree(comp.pid) for comp in state.components.values()))
    again: list[str] = []
    second = up(servers_settings, only=SERVERS, progress=again.append, timeout=30)
    assert {name: comp.pid for name, comp in second.components.items()} == state.alive()
    assert not any("starting" in line for line in again)
    assert any("nothing started" in line for line in again)

    stopped = down(servers_settings, timeout=20)
    assert sorted(stopped) == sorted(SERVERS)
    assert _running(pids) == set()
    assert read_state(servers_settings) is None
    assert down(servers_settings) == []  # nothing left to stop


def test_a_dead_server_is_restarted(servers_settings: Settings) -> None:
    state = up(servers_settings, only={"redis"}, progress=lambda _: None, timeout=30)
    old = state.components["redis"].pid
    os.kill(old, signal.SIGKILL)
    # Generous: under heavy I/O a killed process may sit in an fsync for a while before it exits.
    assert stack_processes.wait_gone(old, timeout=30)

    lines: list[str] = []
    restarted = up(servers_settings, only={"redis"}, progress=lines.append, timeout=30)
    assert restarted.components["redis"].pid != old
    assert restarted.alive() == {"redis": restarted.components["redis"].pid}
    assert any("is gone" in line for line in lines)
    assert down(servers_settings) == ["redis"]


def test_stopping_a_process_group_reaches_every_member(tmp_path: Path) -> None:
    # A stand-in for a prefork pool: a session leader with one child in its process group.
    script = "import subprocess, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"
    leader = stack_processes.spawn_detached([sys.executable, "-c", script], log=tmp_path / "group.log")
    members: set[int] = set()
    for _ in range(100):
        members = {proc.pid for proc in stack_processes.group_members(leader)}
        if len(members) == 2:
            break
        time.sleep(0.05)
    assert len(members) == 2
    stack_processes.stop_process_groups([leader], timeout=5)
    assert _running(members) == set()


def test_a_port_set_and_taken_is_refused_before_anything_starts(servers_settings: Settings) -> None:
    # Another program holds Postgres' port (which the settings set): up says so and starts nothing, not even Redis.
    dsn_port = int(servers_settings.postgres.dsn.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", dsn_port))
        blocker.listen()
        with pytest.raises(StackError, match=rf"PostgreSQL: 127.0.0.1 port {dsn_port} \(postgres.dsn\) is already in "
                                             rf"use, held by pid {os.getpid()}"):
            up(servers_settings, only=SERVERS, progress=lambda _: None, timeout=30)
    assert read_state(servers_settings) is None
    assert down(servers_settings) == []


def test_state_after_a_failed_start_still_lets_down_clean_up(servers_settings: Settings) -> None:
    # A data directory of another PostgreSQL version: it cannot start; Redis, started first, must still be recorded.
    pgdata = servers_settings.data_path / "postgres"
    pgdata.mkdir(parents=True, exist_ok=True)
    (pgdata / "PG_VERSION").write_text("9\n")
    with pytest.raises(StackError, match=r"was made by PostgreSQL 9(.|\n)*still running: redis \(`shardfuse up` again"):
        up(servers_settings, only=SERVERS, progress=lambda _: None, timeout=30)
    state = read_state(servers_settings)
    assert isinstance(state, StackState) and set(state.alive()) == {"redis"}
    assert down(servers_settings) == ["redis"]


def test_a_crashed_postgres_with_a_stale_pidfile_is_restarted(servers_settings: Settings) -> None:
    state = up(servers_settings, only={"postgres"}, progress=lambda _: None, timeout=60)
    postmaster = state.components["postgres"].pid
    family = _tree(postmaster)
    os.kill(postmaster, signal.SIGKILL)  # a crash: postmaster.pid stays behind
    assert stack_processes.wait_gone(postmaster, timeout=30)
    assert (servers_settings.data_path / "postgres" / "postmaster.pid").exists()

    restarted = up(servers_settings, only={"postgres"}, progress=lambda _: None, timeout=60)
    assert restarted.components["postgres"].pid != postmaster
    with psycopg.connect(with_stack_secrets(servers_settings).postgres.dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert down(servers_settings) == ["postgres"]
    assert _running(family | _tree(restarted.components["postgres"].pid)) == set()


def test_workers_and_flower_run_with_exactly_the_settings_up_was_given(data_dir: Path) -> None:
    """Keyword overrides to load_settings exist only in this process (no SHARDFUSE_* variable carries them):
    a worker that did not get them would listen to another broker (up would time out), read another CAS, make
    vectors of another size with another model, and route the document to a shard of 2."""
    redis_port, pg_port = free_port(), free_port()
    settings = load_settings(
        data_dir=data_dir, shards=3,
        broker={"url": f"redis://127.0.0.1:{redis_port}/0", "result_backend": f"redis://127.0.0.1:{redis_port}/1",
                "visibility_timeout_s": 4321},
        postgres={"dsn": f"postgresql://postgres@127.0.0.1:{pg_port}/sf_handoff"},
        stack={"flower_port": free_port(), "api_port": free_port()}, flower={"password": "handoff-flower-pw"},
        embedder={"provider": "hashing", "dimensions": 40}, bm25={"rebuild_debounce_s": 0.2},
        workers={"ingest_concurrency": 1, "embed_concurrency": 2, "query_concurrency": 1},
    )  # fmt: skip
    zone = "handoff"
    path = next(f"doc-{i}.md" for i in range(100) if shard_for(zone, f"doc-{i}.md", 3) == 2)
    layout = StackLayout(settings.data_path)
    try:
        state = up(settings, progress=lambda _: None, timeout=240)  # Flower answered with the password above
        settings = with_stack_secrets(settings)  # plus the passwords up generated for the data dir
        assert read_settings_file(layout.settings_file) == settings
        for name in ("worker-ingest", "flower"):
            assert psutil.Process(state.components[name].pid).environ()[RESOLVED_SETTINGS_ENV] == str(
                layout.settings_file)

        # The app inside a worker was built from them: Celery reports its configuration.
        app = control_app(settings.broker.url)
        try:
            node = worker_nodename(Queue.INGEST)
            conf = (app.control.inspect(destination=[node], timeout=5).conf() or {})[node]
        finally:
            app.close()
        assert conf["broker_transport_options"]["visibility_timeout"] == 4321

        with connect_publisher(settings) as publisher:
            publisher.write(zone=zone, path=path, data=b"# Handoff\n\nThe settingsfileterm reached every worker.\n")
        assert monitor.wait_until_indexed(settings, timeout=120)
        with psycopg.connect(settings.postgres.dsn) as conn:
            row = conn.execute("SELECT d.status, count(c.*), max(vector_dims(c.embedding)) FROM shard_2.documents d "
                               "JOIN shard_2.chunks c ON c.zone = d.zone AND c.path = d.path "
                               "WHERE d.zone = %s AND d.path = %s GROUP BY d.status", (zone, path)).fetchone()
        assert row is not None and row[0] == "indexed" and row[1] > 0 and row[2] == 40
        hits = SearchClient(settings).search(query="settingsfileterm", zone=zone, mode="hybrid")["results"]
        assert [hit["path"] for hit in hits][:1] == [path]
    finally:
        down(settings, timeout=30)
    assert not layout.settings_file.exists()  # down leaves no copy of the secrets behind
