"""A deployment of many nodes on one machine, for tests: nothing shared between the nodes but network addresses.

:func:`shared_servers` starts what a real deployment shares — one Redis (the broker), two PostgreSQL servers
(the shared tables and shard 0 on the first, shard 1 on the second: ``postgres.shard_dsns``) and SeaweedFS
(the CAS, ``s3://``) — each on loopback ports, in folders of their own, with passwords. A :class:`Cluster`
then starts worker pools as nodes: each its own process group (``start_new_session``), with its own empty
data directory (its BM25 copy, metrics and settings file; nothing else under it is read by any other
process), its own Celery node name, started exactly as the embedded stack starts a pool
(:func:`~shardfuse.workers.stack.celery_processes.worker_command`, settings handed over in a 0600 file). The
``shardfuse`` commands a user would run from elsewhere (``publish``, ``wait``, ``ping``) run as subprocesses
configured by environment variables holding addresses only, with a data dir of their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardfuse.pipeline.config.handoff import write_settings_file
from shardfuse.pipeline.config.settings import Settings, load_settings
from shardfuse.pipeline.storage.opening import open_s3_store
from shardfuse.workers.names import Queue
from shardfuse.workers.stack import celery_processes, down, processes, up
from shardfuse.workers.stack.object_store import ObjectStoreServer, start_object_store
from tests.integration.ports import free_port, free_port_run

BUCKET = "shardfuse-cas"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0


def scratch_dir(prefix: str) -> Path:
    """A new empty folder of its own (not under pytest's tmp dir: PostgreSQL, running as its own system user
    when the tests run as root, must be able to enter every parent; ``mkdtemp`` under /tmp allows it)."""
    return Path(tempfile.mkdtemp(prefix=f"shardfuse-mn-{prefix}-"))


@dataclass(frozen=True)
class Servers:
    """The addresses (and credentials) of everything the nodes share."""

    broker_url: str
    result_backend: str
    dsn: str
    shard_dsns: tuple[str, str]
    s3_endpoint: str
    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)

    def settings_values(self, data_dir: Path, extra: Mapping[str, Any]) -> dict[str, Any]:
        """The nested settings of a node or client whose own folder is ``data_dir``: the shared addresses,
        then ``extra`` (merged section by section)."""
        values: dict[str, Any] = {
            "data_dir": str(data_dir),
            "shards": 2,
            "broker": {"url": self.broker_url, "result_backend": self.result_backend},
            "postgres": {"dsn": self.dsn, "shard_dsns": list(self.shard_dsns)},
            "cas": {"url": f"s3://{BUCKET}/content", "s3": {
                "endpoint_url": self.s3_endpoint, "access_key_id": self.access_key,
                "secret_access_key": self.secret_key}},
        }  # fmt: skip
        return _merged(values, extra)


@contextlib.contextmanager
def shared_servers() -> Iterator[Servers]:
    """Redis, two PostgreSQL servers and SeaweedFS (with the CAS bucket) on loopback until the block ends."""
    password = secrets.token_urlsafe(18)
    redis_port, first_pg, second_pg = free_port(), free_port(), free_port()
    broker = f"redis://:{password}@127.0.0.1:{redis_port}"
    dsns = tuple(f"postgresql://shardfuse:{password}@127.0.0.1:{port}/shardfuse" for port in (first_pg, second_pg))
    folders = [scratch_dir("pg-a"), scratch_dir("pg-b"), scratch_dir("s3")]
    stacks = [load_settings(data_dir=str(folder), broker={"url": f"{broker}/0", "result_backend": f"{broker}/1"},
                            postgres={"dsn": dsn}, stack={"flower_port": free_port(), "metrics_port": 0})
              for folder, dsn in zip(folders[:2], dsns, strict=True)]  # fmt: skip
    store: ObjectStoreServer | None = None
    try:
        up(stacks[0], only={"redis", "postgres"}, progress=lambda line: None, timeout=START_TIMEOUT_S)
        up(stacks[1], only={"postgres"}, progress=lambda line: None, timeout=START_TIMEOUT_S)
        access_key, secret_key = "mn" + secrets.token_hex(8), secrets.token_urlsafe(24)
        store = start_object_store(folders[2] / "data", s3_port=free_port_run(8), access_key=access_key,
                                   secret_key=secret_key, log_path=folders[2] / "weed.log")
        servers = Servers(broker_url=f"{broker}/0", result_backend=f"{broker}/1", dsn=dsns[0],
                          shard_dsns=(dsns[0], dsns[1]), s3_endpoint=store.endpoint_url, access_key=access_key,
                          secret_key=secret_key)  # fmt: skip
        cas = open_s3_store(load_settings(**servers.settings_values(folders[2], {})))
        try:
            cas.ensure_bucket()  # as an operator creates the bucket once
        finally:
            cas.close()
        yield servers
    finally:
        if store is not None:
            store.stop()  # its unix sockets in /tmp too
        for settings in reversed(stacks):
            down(settings, timeout=STOP_TIMEOUT_S)
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Node:
    """One worker pool: its own process group, data directory and Celery node name."""

    name: str
    queue: Queue
    data_dir: Path
    settings: Settings
    process: subprocess.Popen[bytes]

    @property
    def nodename(self) -> str:
        return f"{self.name}@{socket.gethostname()}"

    @property
    def log(self) -> Path:
        return self.data_dir / "worker.log"

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the whole process group, as a machine that loses power."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=STOP_TIMEOUT_S)

    def stop(self) -> None:
        """A warm shutdown (SIGTERM to the group), SIGKILL after :data:`STOP_TIMEOUT_S`."""
        processes.stop_process_groups([self.process.pid], timeout=STOP_TIMEOUT_S)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)


class Cluster:
    """Nodes started on :class:`Servers`, and the ``shardfuse`` commands of a user on another machine."""

    def __init__(self, servers: Servers, *, common: Mapping[str, Any]) -> None:
        self.servers = servers
        self.common = dict(common)  # settings every node and client shares (embedder, shards, delivery …)
        self.nodes: dict[str, Node] = {}
        self._folders: list[Path] = []
        self._client_dir = self.new_dir("client")

    # -- nodes -----------------------------------------------------------------------------------------------
    def new_dir(self, name: str) -> Path:
        """A new empty folder, removed with the cluster."""
        folder = scratch_dir(name)
        self._folders.append(folder)
        return folder

    def start(self, name: str, queue: Queue, extra: Mapping[str, Any] | None = None, *,
              data_dir: Path | None = None) -> Node:
        """Start a pool of ``queue`` named ``name`` on ``data_dir`` (default: a new empty folder); ``extra``:
        its own settings."""
        data_dir = data_dir or self.new_dir(name)
        settings = load_settings(**self.servers.settings_values(data_dir, _merged(self.common, extra or {})))
        settings_file = write_settings_file(settings, data_dir / "run" / "settings.json")
        argv = celery_processes.worker_command(queue, concurrency=celery_processes.CONCURRENCY[queue](settings.workers))
        argv[argv.index("-n") + 1] = f"{name}@%h"
        env = celery_processes.worker_env(celery_processes.child_env(os.environ, settings_file), settings, queue)
        with open(data_dir / "worker.log", "ab") as log:
            process = subprocess.Popen(argv, env=env, cwd=data_dir, stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        node = Node(name=name, queue=queue, data_dir=data_dir, settings=settings, process=process)
        self.nodes[name] = node
        return node

    def wait_answering(self, *names: str, timeout: float = START_TIMEOUT_S) -> None:
        """Block until every named node answers a Celery ping through the broker."""
        wanted = {self.nodes[name].nodename for name in names}
        deadline = time.monotonic() + timeout
        while wanted:
            wanted -= celery_processes.answering_workers(self.servers.broker_url, wanted)
            dead = [name for name in names if not self.nodes[name].alive()]
            assert not dead, f"nodes {dead} exited: {self.tail(dead[0])}"
            assert time.monotonic() < deadline, f"nodes {sorted(wanted)} did not answer within {timeout:g}s"

    def wait_ready(self, name: str, *, timeout: float = START_TIMEOUT_S) -> float:
        """Poll ``shardfuse ping query --node …`` until it says the node is ready; the seconds it took."""
        started = time.monotonic()
        node = self.nodes[name]
        while True:
            ping = self.cli("ping", node.queue.value, "--node", node.nodename, "--timeout", "2", check=False)
            if ping.returncode == 0:
                return time.monotonic() - started
            assert node.alive(), f"{name} exited: {self.tail(name)}"
            assert time.monotonic() - started < timeout, f"{name} not ready within {timeout:g}s: {ping.stderr}"
            time.sleep(0.2)

    def tail(self, name: str, size: int = 3000) -> str:
        return self.nodes[name].log.read_text(errors="replace")[-size:]

    def close(self) -> None:
        running = [node for node in self.nodes.values() if node.alive()]
        processes.stop_process_groups([node.process.pid for node in running], timeout=STOP_TIMEOUT_S)
        for node in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(timeout=5)
        for folder in self._folders:
            shutil.rmtree(folder, ignore_errors=True)

    # -- a user elsewhere ------------------------------------------------------------------------------------
    def client_settings(self, extra: Mapping[str, Any] | None = None) -> Settings:
        """The settings of a client on another machine (addresses only, a data dir of its own)."""
        return load_settings(**self.servers.settings_values(self._client_dir, _merged(self.common, extra or {})))

    def client_env(self) -> dict[str, str]:
        """This process's environment without ``SHARDFUSE_*``, plus the client's settings as variables."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDFUSE_")}
        env.update(_variables(self.servers.settings_values(self._client_dir, self.common)))
        return env

    def cli(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """Run ``shardfuse ARGS`` as a client elsewhere would."""
        proc = subprocess.run([sys.executable, "-m", "shardfuse.workers.cli.main", *args], env=self.client_env(),
                              cwd=self._client_dir, capture_output=True, text=True, timeout=timeout)  # fmt: skip
        if check and proc.returncode != 0:
            raise AssertionError(f"shardfuse {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc


@contextlib.contextmanager
def cluster(servers: Servers, *, common: Mapping[str, Any]) -> Iterator[Cluster]:
    """A :class:`Cluster` whose nodes are all stopped (and folders removed) when the block ends."""
    running = Cluster(servers, common=common)
    try:
        yield running
    finally:
        running.close()


def _merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merged(merged[key], value)
        else:
            merged[key] = value
    return merged


def _variables(values: Mapping[str, Any], prefix: str = "SHARDFUSE_") -> dict[str, str]:
    """Nested settings as ``SHARDFUSE_A__B`` variables (lists as JSON, as pydantic-settings reads them)."""
    variables: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key.upper()}"
        if isinstance(value, Mapping):
            variables.update(_variables(value, f"{name}__"))
        else:
            variables[name] = json.dumps(value) if isinstance(value, list | bool) else str(value)
    return variables


__all__ = ["Cluster", "Node", "Servers", "cluster", "scratch_dir", "shared_servers"]
