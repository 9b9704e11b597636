"""Where the deployments serve metrics (docker-compose.yml, k8s/): each worker pool its counters at its own
port, with a multiprocess directory of its own; the exporter its gauges; Prometheus told where to look."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml

from shardfuse.pipeline.observability.multiprocess import MULTIPROC_DIR_ENV
from shardfuse.workers.names import Queue
from tests.support import k8s_objects as k8s
from tests.support.compose_file import volume_mounts
from tests.support.paths import REPO

PORT_ENV = "SHARDFUSE_WORKERS__METRICS_PORT"
overlays = pytest.mark.parametrize("overlay", k8s.OVERLAYS)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return document


def _under(path: str, folder: str) -> bool:
    return PurePosixPath(folder) in PurePosixPath(path).parents


def test_every_compose_worker_pool_serves_its_metrics_from_a_directory_of_its_own(compose: dict[str, Any]) -> None:
    services = compose["services"]
    workers = {name: s for name, s in services.items() if (s.get("command") or [None])[0] == "worker"}
    assert sorted(s["command"][1] for s in workers.values()) == sorted(q.value for q in Queue)
    for name, service in workers.items():
        port = int(service["environment"][PORT_ENV])
        assert port > 0 and str(port) in [str(p) for p in service.get("expose", [])], name
        assert "ports" not in service, f"{name}: a published port would stop --scale"
        # In the container's own filesystem: a shared volume would let replicas empty each other's counts.
        directory = service["environment"][MULTIPROC_DIR_ENV]
        assert _under(directory, "/tmp"), name
        targets = [mount.target for mount in volume_mounts(service)]
        assert not any(directory == t or _under(directory, t) for t in targets), name
    for name, service in services.items():
        if name not in workers:  # nothing else counts into a directory nobody empties or reads
            assert MULTIPROC_DIR_ENV not in (service.get("environment") or {}), name


def test_the_compose_exporter_listens_where_it_is_published_and_checked(compose: dict[str, Any]) -> None:
    exporter = compose["services"]["exporter"]
    command = exporter["command"]
    port = command[command.index("--port") + 1]
    assert any(str(entry).endswith(f":{port}") for entry in exporter["ports"])
    assert f":{port}/metrics" in " ".join(exporter["healthcheck"]["test"])


def _annotated_port(workload: dict[str, Any]) -> int:
    annotations = workload["spec"]["template"]["metadata"].get("annotations") or {}
    assert annotations.get("prometheus.io/scrape") == "true", workload["metadata"]["name"]
    assert annotations.get("prometheus.io/path", "/metrics") == "/metrics"
    return int(annotations["prometheus.io/port"])


def _container_port(container: dict[str, Any], name: str) -> int:
    (port,) = [p["containerPort"] for p in container.get("ports") or [] if p.get("name") == name]
    return int(port)


@overlays
def test_every_worker_pod_is_scraped_where_its_pool_serves(overlay: str) -> None:
    for queue, (deployment,) in k8s.worker_pools(k8s.objects(overlay)).items():
        (container,) = k8s.pod_spec(deployment)["containers"]
        env = k8s.resolved_env(container)
        port = int(env[PORT_ENV])
        assert _annotated_port(deployment) == port == _container_port(container, "metrics"), f"{overlay}: {queue}"
        # The directory is on a volume of the pod alone (the root filesystem is read-only).
        directory = env[MULTIPROC_DIR_ENV]
        volumes = {v["name"]: v for v in k8s.pod_spec(deployment).get("volumes") or []}
        (mount,) = [m for m in container.get("volumeMounts") or [] if _under(directory, m["mountPath"])]
        assert "emptyDir" in volumes[mount["name"]], f"{overlay}: {queue} counts into {mount['name']}"
        assert not mount.get("readOnly"), f"{overlay}: {queue}"


@overlays
def test_the_exporter_pod_is_scraped_where_it_listens(overlay: str) -> None:
    items = k8s.objects(overlay)
    exporter = k8s.named(items, "Deployment", "exporter")
    (container,) = k8s.pod_spec(exporter)["containers"]
    args = container["args"]
    port = int(args[args.index("--port") + 1])
    assert _annotated_port(exporter) == port == _container_port(container, "metrics")
    assert MULTIPROC_DIR_ENV not in k8s.resolved_env(container)
