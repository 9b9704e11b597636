"""A worker pool's metrics endpoint through its lifecycle (shardfuse.workers.observability.PoolMetrics): the
receivers of Celery's worker signals, called as Celery calls them, with a fakeredis and real HTTP."""

from __future__ import annotations

import logging
import os
import types
import urllib.error
import urllib.request
from pathlib import Path

import fakeredis
import pytest
from celery import Celery, signals

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.observability import metrics
from shardfuse.pipeline.observability.endpoint_directory import EndpointDirectory
from shardfuse.pipeline.observability.metric_totals import parse_scrape
from shardfuse.workers.names import Queue
from shardfuse.workers.observability import PoolMetrics, connect_observability
from shardfuse.workers.stack import celery_processes
from tests.integration.ports import free_port
from tests.support.counting_processes import count_in_children


def _worker(pool_cls: str, **options: object) -> types.SimpleNamespace:
    """What ``worker_init`` sends: the worker, with its ``-P`` pool and its command-line options."""
    return types.SimpleNamespace(hostname="ingest@box", pool_cls=pool_cls, options=options)


def _read(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def test_a_prefork_pool_serves_the_sum_of_its_processes_and_announces_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: fakeredis.FakeRedis
) -> None:
    directory = tmp_path / "metrics"
    directory.mkdir()
    (directory / "counter_999999.db").write_bytes(b"left by the last run")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))  # what the launcher gives the worker
    pool = PoolMetrics(Settings(), redis_client=lambda: client)
    port = free_port()

    pool.pool_starts(sender=_worker("prefork", metrics_port=port, metrics_address="127.0.0.1"))
    try:
        assert not (directory / "counter_999999.db").exists()  # emptied before the pool forks
        announced = EndpointDirectory(client, stale_after_s=60).endpoints()
        assert [(e.node, e.url) for e in announced] == [("ingest@box", f"http://127.0.0.1:{port}/metrics")]
        count_in_children(directory, [("inc", "EVENTS", 2, {"stage": "ingest", "outcome": "prepared"})], children=3,
                          kill=1)
        totals = parse_scrape(_read(announced[0].url))
        assert totals.counter(metrics.EVENTS, stage="ingest", outcome="prepared") == 6
    finally:
        pool.pool_stops()
    assert EndpointDirectory(client, stale_after_s=60).endpoints() == []  # withdrawn
    with pytest.raises(urllib.error.URLError):
        _read(f"http://127.0.0.1:{port}/metrics")


def test_the_metrics_port_comes_from_the_settings_unless_the_worker_option_says(
    monkeypatch: pytest.MonkeyPatch, client: fakeredis.FakeRedis
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    port = free_port()
    pool = PoolMetrics(Settings(workers={"metrics_port": port}), redis_client=lambda: client)
    pool.pool_starts(sender=_worker("threads", metrics_address="127.0.0.1"))  # a threads pool: one process
    try:
        assert pool.server is not None and pool.server.port == port
        metrics.inc(metrics.EVENTS, 1, stage="test-threads-pool", outcome="ok")  # counted by this process
        assert parse_scrape(_read(pool.server.url)).counter(metrics.EVENTS, stage="test-threads-pool") == 1
    finally:
        pool.pool_stops()

    off = PoolMetrics(Settings(workers={"metrics_port": port}), redis_client=lambda: client)
    off.pool_starts(sender=_worker("threads", metrics_port=0))  # --metrics-port 0: none
    assert off.server is None and EndpointDirectory(client, stale_after_s=60).endpoints() == []


def test_a_prefork_pool_without_a_directory_serves_nothing_and_says_why(
    monkeypatch: pytest.MonkeyPatch, client: fakeredis.FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    pool = PoolMetrics(Settings(workers={"metrics_port": free_port()}), redis_client=lambda: client)
    with caplog.at_level(logging.ERROR, logger="shardfuse.workers.observability"):
        pool.pool_starts(sender=_worker("prefork"))
    assert pool.server is None
    assert "PROMETHEUS_MULTIPROC_DIR" in caplog.text


def test_a_port_in_use_is_logged_and_the_worker_carries_on(
    monkeypatch: pytest.MonkeyPatch, client: fakeredis.FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    first = PoolMetrics(Settings(), redis_client=lambda: client)
    port = free_port()
    first.pool_starts(sender=_worker("threads", metrics_port=port, metrics_address="127.0.0.1"))
    try:
        second = PoolMetrics(Settings(), redis_client=lambda: client)
        with caplog.at_level(logging.ERROR, logger="shardfuse.workers.observability"):
            second.pool_starts(sender=_worker("threads", metrics_port=port, metrics_address="127.0.0.1"))
        assert second.server is None and "cannot listen" in caplog.text
    finally:
        first.pool_stops()


def test_a_forked_child_lets_go_of_the_listening_socket_and_marks_itself_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: fakeredis.FakeRedis
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    pool = PoolMetrics(Settings(), redis_client=lambda: client)
    pool.pool_starts(sender=_worker("prefork", metrics_port=free_port(), metrics_address="127.0.0.1"))
    try:
        server = pool.server
        assert server is not None
        pool.child_starts()  # in the main process itself (the solo pool): it keeps serving
        assert pool.server is server
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # a pool child: closes its copy of the listening socket, and serves nothing
            try:
                pool.child_starts()
                os.write(write_end, b"open" if pool.server is not None or server.listening else b"closed")
            finally:
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            assert pipe.read() == b"closed"
        os.waitpid(pid, 0)
        assert server.listening and _read(server.url) == ""  # the parent still serves (nothing counted yet)
        live = tmp_path / "gauge_livesum_4242.db"
        live.write_bytes(b"")
        kept = tmp_path / "counter_4242.db"
        kept.write_bytes(b"")
        pool.child_exits(pid=4242, exitcode=0)
        assert not live.exists() and kept.exists()
    finally:
        pool.pool_stops()


def test_the_worker_takes_the_metrics_options() -> None:
    app = Celery("test-pool-metrics", set_as_current=False)
    app.shardfuse_settings = Settings()  # type: ignore[attr-defined]
    disconnect = connect_observability(app)
    try:
        connect_observability(app)()  # a second connect adds no second option
        names = sorted(option.name for option in app.user_options["worker"])
        assert names == ["metrics_address", "metrics_port"]
    finally:
        disconnect()


def test_another_apps_worker_in_the_process_leaves_this_pools_endpoint_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Celery's worker signals are global to a process: another app's worker (a test's in-thread worker, an
    # application's own app) sends them too. Before it was told apart, its worker_init emptied this pool's
    # metrics directory and served this pool's port.
    left = tmp_path / "counter_999999.db"
    left.write_bytes(b"counted by this pool's children")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    port = free_port()
    app = Celery("test-ours", set_as_current=False)
    app.shardfuse_settings = Settings(  # type: ignore[attr-defined]
        workers={"metrics_port": port}, broker={"url": f"redis://127.0.0.1:{free_port()}/0"})  # Redis down: logged
    url = f"http://127.0.0.1:{port}/metrics"

    class Worker:  # what a worker signal sends (hashable, as Celery's sender caches need)
        def __init__(self, of: Celery) -> None:
            self.app, self.hostname, self.pool_cls = of, f"{of.main}@box", "threads"
            self.options = {"metrics_address": "127.0.0.1"}

    theirs, ours = Worker(Celery("test-theirs", set_as_current=False)), Worker(app)
    disconnect = connect_observability(app)
    try:
        signals.worker_init.send(sender=theirs)
        signals.worker_process_init.send(sender=None)
        assert left.exists()
        with pytest.raises(urllib.error.URLError):
            _read(url)
        signals.worker_init.send(sender=ours)
        assert not left.exists()  # emptied for this pool's own start
        assert _read(url) == ""  # served (nothing counted in this process yet)
        signals.worker_shutdown.send(sender=theirs)
        assert _read(url) == ""  # still served: their worker stopped, not ours
        signals.worker_shutdown.send(sender=ours)
        with pytest.raises(urllib.error.URLError):
            _read(url)
    finally:
        disconnect()


def test_each_embedded_pool_gets_its_own_loopback_port_and_directory(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, stack={"metrics_port": 20100})
    commands = celery_processes.worker_commands(settings)
    served = {}
    for queue in Queue:
        command = commands[celery_processes.worker_component(queue)]
        address, port = command[command.index("--metrics-address") + 1], command[command.index("--metrics-port") + 1]
        served[queue] = (address, int(port))
    assert served == {Queue.INGEST: ("127.0.0.1", 20100), Queue.EMBED: ("127.0.0.1", 20101),
                      Queue.MAINTENANCE: ("127.0.0.1", 20102), Queue.QUERY: ("127.0.0.1", 20103)}
    directories = {celery_processes.worker_env({"PATH": "/bin"}, settings, queue)["PROMETHEUS_MULTIPROC_DIR"]
                   for queue in Queue}
    assert directories == {str(tmp_path / "run" / "metrics" / queue.value) for queue in Queue}

    off = celery_processes.worker_commands(Settings(data_dir=tmp_path, stack={"metrics_port": 0}))
    assert not any("--metrics-port" in command for command in off.values())  # workers.metrics_port decides
