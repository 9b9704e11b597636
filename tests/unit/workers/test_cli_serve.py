"""``shardfuse worker | flower | ping``: what a container runs.

The exec'd command lines are checked as data (nothing is exec'd: ``serve._exec`` is replaced by a recorder
wherever a handler runs). The ping probe runs for real, as a subprocess, against a broker that is down, a
broker with no worker, and a broker with an in-thread Celery worker registered under this host's node name.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from pydantic import SecretStr

from shardfuse.pipeline.config.handoff import RESOLVED_SETTINGS_ENV, read_settings_file
from shardfuse.pipeline.config.settings import FlowerSettings, Settings, WorkerSettings, load_settings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.workers.broker.serialization import JSON_ONLY
from shardfuse.workers.cli import main as cli_main
from shardfuse.workers.cli import serve
from shardfuse.workers.names import QUEUE_POOLS, QUEUE_PREFETCH, Queue
from shardfuse.workers.stack import celery_processes
from tests.support.deployment import cli_check
from tests.support.paths import REPO
from tests.support.socket_redis import socket_redis

SETTINGS = Settings(
    data_dir=Path("/srv/shardfuse-data"),
    workers=WorkerSettings(ingest_concurrency=3, embed_concurrency=11, maintenance_concurrency=2, query_concurrency=6),
    flower=FlowerSettings(user="ops", password=SecretStr("fl0wer-s3cret")),
)
EXPECTED_CONCURRENCY = {Queue.INGEST: 3, Queue.EMBED: 11, Queue.MAINTENANCE: 2, Queue.QUERY: 6}
SETTINGS_FILE = Path("/tmp/shardfuse-settings-test.json")


def option(argv: list[str], name: str) -> str:
    """The value following ``name`` in ``argv`` (which must hold it exactly once)."""
    assert argv.count(name) == 1, f"{name} appears {argv.count(name)} times in {argv}"
    return argv[argv.index(name) + 1]


# -- the worker command line ------------------------------------------------------------------------------


@pytest.mark.parametrize("queue", list(Queue))
def test_worker_runs_the_queue_pool_the_embedded_stack_runs(queue: Queue) -> None:
    spec = serve.worker_exec(queue, SETTINGS, base_env={}, settings_file=SETTINGS_FILE)
    assert spec.argv[:6] == [sys.executable, "-m", "celery", "-A", celery_processes.CELERY_APP, "worker"]
    assert Path(spec.argv[0]).is_file()  # exec needs a path, not a name looked up on PATH
    assert option(spec.argv, "-Q") == queue.value
    assert option(spec.argv, "-P") == QUEUE_POOLS[queue]
    assert option(spec.argv, "--prefetch-multiplier") == str(QUEUE_PREFETCH[queue])
    assert option(spec.argv, "-n") == f"{queue.value}@%h"  # what `shardfuse ping` asks for
    assert "-E" in spec.argv  # task events, for Flower
    assert option(spec.argv, "-c") == str(EXPECTED_CONCURRENCY[queue])  # the settings' concurrency


def test_worker_concurrency_and_log_level_options_win() -> None:
    spec = serve.worker_exec(Queue.EMBED, SETTINGS, base_env={}, settings_file=SETTINGS_FILE, concurrency=4,
                             loglevel="DEBUG")
    assert option(spec.argv, "-c") == "4"
    assert option(spec.argv, "--loglevel") == "DEBUG"


def test_worker_environment_names_the_settings_file_not_the_settings_variables() -> None:
    base = {"SHARDFUSE_BROKER__URL": "redis://:pw@redis:6379/0", "SHARDFUSE_CONFIG": "/etc/shardfuse/shardfuse.toml",
            "PATH": "/usr/bin"}
    spec = serve.worker_exec(Queue.INGEST, SETTINGS, base_env=base, settings_file=SETTINGS_FILE)
    assert spec.env == {"PATH": "/usr/bin", RESOLVED_SETTINGS_ENV: str(SETTINGS_FILE)}
    assert "pw" not in " ".join(spec.argv)


def test_worker_command_execs_with_the_settings_concurrency(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ran = record_exec(monkeypatch, tmp_path)
    monkeypatch.setenv("SHARDFUSE_WORKERS__MAINTENANCE_CONCURRENCY", "3")
    with pytest.raises(Execed):
        cli_main.main(["worker", "maintenance", "--loglevel", "warning"])
    (spec,) = ran
    assert option(spec.argv, "-Q") == "maintenance"
    assert option(spec.argv, "-c") == "3"
    assert option(spec.argv, "--loglevel") == "WARNING"
    assert handed_over(spec).workers.maintenance_concurrency == 3  # the worker runs with the same settings


def test_config_and_data_dir_options_reach_the_exec_d_worker_without_touching_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ran = record_exec(monkeypatch, tmp_path)
    config = tmp_path / "site.toml"
    config.write_text('shards = 3\n[flower]\npassword = "from-the-file"\n')
    monkeypatch.setenv("SHARDFUSE_EMBEDDER__PROVIDER", "hashing")
    monkeypatch.chdir(tmp_path)
    before = dict(os.environ)
    with pytest.raises(Execed):
        cli_main.main(["--config", str(config), "--data-dir", "data", "worker", "ingest"])
    assert dict(os.environ) == before
    settings = handed_over(ran[0])
    assert settings == load_settings(config, data_dir=tmp_path / "data")
    assert (settings.shards, settings.data_dir, settings.embedder.provider) == (3, tmp_path / "data", "hashing")
    assert settings.flower.password.get_secret_value() == "from-the-file"
    assert not any(name.startswith("SHARDFUSE_") for name in ran[0].env if name != RESOLVED_SETTINGS_ENV)


def test_worker_command_line_option_overrides_the_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ran = record_exec(monkeypatch, tmp_path)
    monkeypatch.setenv("SHARDFUSE_WORKERS__QUERY_CONCURRENCY", "3")
    with pytest.raises(Execed):
        cli_main.main(["worker", "query", "--concurrency", "9"])
    assert option(ran[0].argv, "-c") == "9"


def test_exec_replaces_the_process_with_the_program_and_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, list[str], dict[str, str]]] = []

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        calls.append((path, argv, env))
        raise Execed

    monkeypatch.setattr(os, "execve", execve)
    spec = serve.Exec(argv=["/usr/bin/prog", "a"], env={"K": "v"})
    with pytest.raises(Execed):
        serve._exec(spec)
    assert calls == [("/usr/bin/prog", ["/usr/bin/prog", "a"], {"K": "v"})]


# -- Flower -----------------------------------------------------------------------------------------------


def test_flower_is_persistent_under_the_data_dir_with_the_password_only_in_its_environment() -> None:
    spec = serve.flower_exec(SETTINGS, base_env={"SHARDFUSE_DATA_DIR": "/srv/shardfuse-data"},
                             settings_file=SETTINGS_FILE)
    assert spec.argv[:6] == [sys.executable, "-m", "celery", "-A", celery_processes.CELERY_APP, "flower"]
    assert "--persistent=True" in spec.argv
    assert "--db=/srv/shardfuse-data/flower/flower.db" in spec.argv
    assert "--address=0.0.0.0" in spec.argv and "--port=5555" in spec.argv
    assert "fl0wer-s3cret" not in " ".join(spec.argv)
    assert spec.env == {"FLOWER_BASIC_AUTH": "ops:fl0wer-s3cret", RESOLVED_SETTINGS_ENV: str(SETTINGS_FILE)}


def test_flower_address_port_and_db_options(tmp_path: Path) -> None:
    spec = serve.flower_exec(SETTINGS, base_env={}, settings_file=SETTINGS_FILE, address="127.0.0.1", port=8080,
                             db=str(tmp_path / "f.db"))
    assert {"--address=127.0.0.1", "--port=8080", f"--db={tmp_path / 'f.db'}"} <= set(spec.argv)


def test_flower_refuses_an_empty_password() -> None:
    settings = Settings(flower=FlowerSettings(user="ops", password=SecretStr("")))
    with pytest.raises(ConfigurationError, match="SHARDFUSE_FLOWER__PASSWORD"):
        serve.flower_exec(settings, base_env={}, settings_file=SETTINGS_FILE)


def test_flower_command_with_an_empty_password_exits_2_without_starting_flower(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ran = record_exec(monkeypatch, tmp_path)
    monkeypatch.setenv("SHARDFUSE_FLOWER__PASSWORD", "")
    assert cli_main.main(["flower"]) == 2
    assert ran == [] and list(tmp_path.iterdir()) == []  # no settings file written either
    assert "SHARDFUSE_FLOWER__PASSWORD" in capsys.readouterr().err


def test_flower_command_creates_the_folder_of_its_db(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ran = record_exec(monkeypatch, tmp_path)
    monkeypatch.setenv("SHARDFUSE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SHARDFUSE_FLOWER__PASSWORD", "not-the-default")
    with pytest.raises(Execed):
        cli_main.main(["flower", "--port", "5556"])
    assert (tmp_path / "data" / "flower").is_dir()
    assert f"--db={tmp_path / 'data' / 'flower' / 'flower.db'}" in ran[0].argv
    assert ran[0].env["FLOWER_BASIC_AUTH"].endswith(":not-the-default")
    assert handed_over(ran[0]).data_dir == tmp_path / "data"


# -- argument checking -------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["worker", "ingest"], ["worker", "embed", "--concurrency", "4", "--loglevel", "debug"],
    ["flower", "--address", "0.0.0.0", "--port", "5555", "--db", "/var/lib/shardfuse/flower/flower.db"],
    ["ping", "query", "--timeout", "2.5", "--node", "query@pod-1"],
])  # fmt: skip
def test_valid_command_lines_parse(argv: list[str]) -> None:
    cli_check(argv)


@pytest.mark.parametrize("argv", [
    ["worker"], ["worker", "search"], ["worker", "embed", "--concurrency", "0"], ["worker", "embed", "--loglevel", "x"],
    ["flower", "--port", "70000"], ["ping", "ingest", "--timeout", "0"], ["ping"],
])  # fmt: skip
def test_bad_command_lines_are_rejected(argv: list[str]) -> None:
    with pytest.raises(AssertionError, match="shardfuse rejects"):
        cli_check(argv)


def test_ping_asks_this_hosts_node_of_the_pool_unless_told_otherwise() -> None:
    assert serve.ping_node(Queue.EMBED, None) == f"embed@{socket.gethostname()}"
    assert serve.ping_node(Queue.EMBED, "embed@elsewhere") == "embed@elsewhere"


# -- the ping probe against real brokers -----------------------------------------------------------------


def ping(broker_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("SHARDFUSE_")}
    env.update(SHARDFUSE_BROKER__URL=broker_url, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "shardfuse.workers.cli.main", "ping", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_ping_fails_when_the_broker_is_down() -> None:
    with socket.socket() as sock:  # a port nothing listens on (bound, never listened, then closed)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = ping(f"redis://:secret-pw@127.0.0.1:{port}/0", "ingest", "--timeout", "1")
    assert proc.returncode == 1
    assert "unreachable" in proc.stderr and f"127.0.0.1:{port}" in proc.stderr
    assert "secret-pw" not in proc.stderr + proc.stdout


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server on a unix socket (tests/support/socket_redis.py); yields its broker URL."""
    with socket_redis(tmp_path_factory.mktemp("broker")) as sock:
        yield f"redis+socket://{sock}"


def test_ping_fails_when_no_worker_answers(broker: str) -> None:
    proc = ping(broker, "embed", "--timeout", "1")
    assert proc.returncode == 1
    assert f"embed@{socket.gethostname()} did not answer" in proc.stderr


def test_ping_succeeds_when_this_hosts_worker_of_the_pool_answers(broker: str) -> None:
    app = Celery("ping-target", broker=broker, set_as_current=False)
    app.conf.update(JSON_ONLY, worker_hijack_root_logger=False)
    # Celery's logging set-up for the in-thread worker changes the root logger's level and handlers; later
    # tests of this process read log records, so it is put back as it was.
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, hostname=f"query@{socket.gethostname()}"):
            answered = ping(broker, "query", "--timeout", "3")
            other_pool = ping(broker, "ingest", "--timeout", "1")
    finally:
        root.setLevel(level)
        root.handlers[:] = handlers
    assert answered.returncode == 0, answered.stderr
    assert "pong" in answered.stdout
    assert other_pool.returncode == 1  # the answer of another pool's worker does not count


# -- helpers ------------------------------------------------------------------------------------------------


class Execed(Exception):
    """Raised by the recorder in place of replacing the test process."""


def handed_over(spec: serve.Exec) -> Settings:
    """The settings an exec'd process would run with: the file its environment names (private to its user)."""
    path = Path(spec.env[RESOLVED_SETTINGS_ENV])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    return read_settings_file(path)


def record_exec(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[serve.Exec]:
    """Replace ``serve._exec`` (never exec from a test: it would replace pytest) with a recorder; the settings
    files the handlers write go to ``tmp_path``."""
    ran: list[serve.Exec] = []

    def fake(spec: serve.Exec) -> None:
        ran.append(spec)
        raise Execed

    monkeypatch.setattr(serve, "_exec", fake)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for name in [name for name in os.environ if name.startswith("SHARDFUSE_")]:
        monkeypatch.delenv(name)
    return ran
