"""One real embedded stack per test session: Redis, PostgreSQL + pgvector, the four Celery worker pools
and Flower, on free loopback ports in a temporary folder, started by ``shardfuse.workers.stack.up`` and stopped by
``shardfuse.workers.stack.down`` (which must leave no process behind)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from psycopg import sql

from shardfuse.pipeline.admin.publisher import Publisher
from shardfuse.pipeline.config.settings import Settings, load_settings
from shardfuse.pipeline.index.store import ShardStore, open_pool
from shardfuse.pipeline.index.store.vector_index import BuildSettings
from shardfuse.pipeline.storage.cas import LocalContentStore
from shardfuse.workers import monitor
from shardfuse.workers.client import SearchClient
from shardfuse.workers.names import Queue
from shardfuse.workers.publishing import CeleryEventSink
from shardfuse.workers.stack import StackState, down, up
from tests.integration.ports import free_port, free_port_run

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Stack:
    settings: Settings
    state: StackState
    env: dict[str, str]
    _client: SearchClient | None = None

    def publisher(self) -> Any:
        """A context manager yielding a Publisher bound to this stack."""
        return _PublisherContext(self.settings)

    def wait(self, timeout: float = 120) -> None:
        assert monitor.wait_until_indexed(self.settings, timeout=timeout), "pipeline did not drain in time"

    def search(self, query: str, zone: str, **kwargs: Any) -> dict[str, Any]:
        if self._client is None:
            self._client = SearchClient(self.settings)
        return self._client.search(query=query, zone=zone, **kwargs)

    def cli(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "shardfuse.workers.cli.main", *args],
            env=self.env, cwd=REPO, capture_output=True, text=True, timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"shardfuse {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc


class _PublisherContext:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._cm: Any = None

    def __enter__(self) -> Publisher:
        self._cm = CeleryEventSink.connect(self._settings)
        sink = self._cm.__enter__()
        return Publisher(cas=LocalContentStore(self._settings.cas_root), sink=sink)

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)


def live_documents(stack: Stack, zone: str) -> dict[str, str]:
    """What every shard holds for ``zone`` and not as a tombstone: path -> content hash."""
    held: dict[str, str] = {}
    for shard in range(stack.settings.shards):
        with psycopg.connect(stack.settings.shard_dsn(shard)) as conn:
            rows = conn.execute(sql.SQL("SELECT path, content_hash FROM {}.documents WHERE zone = %s "
                                        "AND status <> 'deleted'").format(sql.Identifier(f"shard_{shard}")),
                                (zone,)).fetchall()
        held.update({path: content_hash for path, content_hash in rows})
    return held


@contextlib.contextmanager
def scratch_store(
    stack: Stack, prefix: str, *, dimensions: int, index: BuildSettings | None = None
) -> Iterator[ShardStore]:
    """Shard 0 of a new database of ``stack``'s PostgreSQL, its schema created: a store no other test sees."""
    base = stack.settings.postgres.dsn
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    pool = open_pool(base.rsplit("/", 1)[0] + f"/{name}", max_size=4)
    try:
        store = ShardStore(pool, 0, dimensions=dimensions, index=index)
        store.ensure_schema()
        yield store
    finally:
        pool.close()


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    overrides = {
        "SHARDFUSE_EMBEDDER__PROVIDER": "hashing",
        # The chunk embedding cache, which "auto" leaves off for the hashing embedder, stays on in the
        # session's stack: its tests (test_security, test_metrics) read it through the pipeline.
        "SHARDFUSE_EMBEDDER__CACHE": "on",
        "SHARDFUSE_BM25__REBUILD_DEBOUNCE_S": "0.2",
        # Small enough that one test's load (test_end_to_end's bulk load) defers the HNSW index, large
        # enough that the other tests' few documents never do.
        "SHARDFUSE_VECTOR_INDEX__DEFER_MIN_ROWS": "150",
        "SHARDFUSE_VECTOR_INDEX__BUILD_DEBOUNCE_S": "0.5",
        "SHARDFUSE_SHARDS": "2",
        # Dead workers noticed within seconds (tests/integration/test_delivery.py).
        "SHARDFUSE_DELIVERY__HEARTBEAT_S": "1",
        "SHARDFUSE_DELIVERY__DEAD_AFTER_S": "6",
        "SHARDFUSE_DELIVERY__BUSY_RETRY_S": "1",
        # A second embedding model every worker knows, for reindexing a zone (tests/integration/test_reindex.py).
        "SHARDFUSE_EMBEDDERS__MINI__PROVIDER": "hashing",
        "SHARDFUSE_EMBEDDERS__MINI__DIMENSIONS": "48",
    }
    with running_stack(overrides) as running:
        yield running


def settings_overrides(variables: Mapping[str, str]) -> dict[str, Any]:
    """``SHARDFUSE_*`` variables as the keyword overrides of ``load_settings``: ``SHARDFUSE_A__B=v`` becomes
    ``{"a": {"b": "v"}}`` (pydantic converts the strings as it does the environment's; scalars only)."""
    nested: dict[str, Any] = {}
    for name, value in variables.items():
        *sections, key = name.removeprefix("SHARDFUSE_").lower().split("__")
        target = nested
        for section in sections:
            target = target.setdefault(section, {})
        target[key] = value
    return nested


@contextlib.contextmanager
def running_stack(overrides: dict[str, str]) -> Iterator[Stack]:
    """A whole stack on free ports in a new folder, configured by ``overrides`` (``SHARDFUSE_*`` variables).

    This process's environment is left alone: the settings are built with the overrides as keyword
    overrides, and ``up`` hands exactly those to the workers and Flower. ``Stack.env`` holds the variables
    for the ``shardfuse`` commands the tests run as subprocesses, which resolve the same settings."""
    # Not under pytest's tmp dir: pytest resets it to mode 0700 at every session start, and PostgreSQL,
    # running as its own system user when the tests run as root, must be able to enter every parent.
    data_dir = Path(tempfile.mkdtemp(prefix="shardfuse-test-"))
    redis_port, pg_port, flower_port = free_port(), free_port(), free_port()
    overrides = {
        "SHARDFUSE_DATA_DIR": str(data_dir),
        "SHARDFUSE_BROKER__URL": f"redis://127.0.0.1:{redis_port}/0",
        "SHARDFUSE_BROKER__RESULT_BACKEND": f"redis://127.0.0.1:{redis_port}/1",
        "SHARDFUSE_POSTGRES__DSN": f"postgresql://postgres@127.0.0.1:{pg_port}/shardfuse",
        "SHARDFUSE_STACK__FLOWER_PORT": str(flower_port),
        "SHARDFUSE_STACK__API_PORT": str(free_port()),  # the HTTP API (tests/integration/test_http_api.py)
        "SHARDFUSE_STACK__METRICS_PORT": str(free_port_run(len(Queue))),  # the pools' /metrics
        **overrides,
    }
    env = {**os.environ, **overrides}
    settings = load_settings(**settings_overrides(overrides))
    state = up(settings, progress=lambda line: None, timeout=180)
    # Again, now that the first ``up`` of the data dir has generated its passwords: resolved like any
    # shardfuse command's settings, they carry them (pipeline/config/stack_secrets.py).
    settings = load_settings(**settings_overrides(overrides))
    try:
        yield Stack(settings=settings, state=state, env=env)
    finally:
        pids = [c.pid for c in state.components.values()]
        children = []
        for pid in pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                children.extend(p.pid for p in psutil.Process(pid).children(recursive=True))
        stopped = down(settings, timeout=30)
        time.sleep(0.5)
        left = [pid for pid in pids + children if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        assert set(stopped) == set(state.components), f"down stopped {stopped}"
        assert not left, f"processes left behind after down: {left}"
        shutil.rmtree(data_dir, ignore_errors=True)
