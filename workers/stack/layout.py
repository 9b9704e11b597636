"""Where the embedded stack keeps its files under ``settings.data_path``."""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

# Unix socket paths are limited to ~107 bytes (sun_path); leave room for "/.s.PGSQL.NNNNN".
MAX_SOCKET_DIR_LEN = 90


@dataclass(frozen=True)
class StackLayout:
    """The folder tree of one embedded stack.

    ::

        <data_dir>/run/stack.json      recorded state (pids, logs, addresses)
        <data_dir>/run/settings.json   the settings the workers and Flower run with (mode 0600)
        <data_dir>/run/redis.pid       Redis pidfile
        <data_dir>/run/postgres/       PostgreSQL unix socket (if the path is short enough)
        <data_dir>/logs/<name>.log     one log per component
        <data_dir>/redis/              Redis append-only file
        <data_dir>/postgres/           PGDATA
        <data_dir>/objects/            the object store's volumes and filer (an s3:// CAS on loopback only)
        <data_dir>/flower/flower.db    Flower's persistent state
    """

    data_dir: Path

    @property
    def run_dir(self) -> Path:
        return self.data_dir / "run"

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def state_file(self) -> Path:
        return self.run_dir / "stack.json"

    @property
    def settings_file(self) -> Path:
        """The resolved settings ``up`` hands its workers and Flower (secrets included: mode 0600)."""
        return self.run_dir / "settings.json"

    @property
    def redis_dir(self) -> Path:
        return self.data_dir / "redis"

    @property
    def redis_pidfile(self) -> Path:
        return self.run_dir / "redis.pid"

    @property
    def pgdata(self) -> Path:
        return self.data_dir / "postgres"

    @property
    def objects_dir(self) -> Path:
        """SeaweedFS's data (created when it first starts: a stack with a local CAS has none)."""
        return self.data_dir / "objects"

    @property
    def flower_db(self) -> Path:
        return self.data_dir / "flower" / "flower.db"

    def log_file(self, component: str) -> Path:
        """The log file of one component (``redis``, ``worker-ingest`` …)."""
        return self.logs_dir / f"{component}.log"

    @property
    def postgres_socket_dir(self) -> Path:
        """Under ``run/`` when the path fits in a unix socket address, else a per-data-dir folder in /tmp."""
        preferred = self.run_dir / "postgres"
        if len(str(preferred)) <= MAX_SOCKET_DIR_LEN:
            return preferred
        digest = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"shardfuse-pg-{digest}"

    def create(self) -> None:
        """Create every folder (the data dir included) that does not exist yet."""
        for folder in (self.run_dir, self.logs_dir, self.redis_dir, self.pgdata, self.flower_db.parent):
            folder.mkdir(parents=True, exist_ok=True)
