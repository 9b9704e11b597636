"""The Kubernetes manifests (k8s/) without shared storage: no ReadWriteMany claim, no volume two workloads
mount, every shardfuse pod's data dir its own emptyDir, and the CAS in the object store, reached with the
keys the store was started with. (Rendering and the general checks: test_deploy_k8s.py.)
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any
from urllib.parse import urlsplit

import pytest

from shardfuse.pipeline.config.cas_location import S3Location
from tests.support import k8s_objects as k8s

OBJECT_STORE = "seaweedfs"
overlays = pytest.mark.parametrize("overlay", k8s.OVERLAYS)


def claim_templates(workload: dict[str, Any]) -> list[dict[str, Any]]:
    return list(workload["spec"].get("volumeClaimTemplates") or [])


def weed_flags(container: dict[str, Any]) -> dict[str, str]:
    """``-name=value`` arguments of the object store's ``weed`` command line."""
    return {arg.lstrip("-").partition("=")[0]: arg.partition("=")[2] or "true"
            for arg in container.get("args") or [] if arg.startswith("-")}  # fmt: skip


@overlays
def test_no_claim_asks_for_a_volume_many_nodes_mount(overlay: str) -> None:
    """ReadWriteMany (NFS, EFS, CephFS …) is what most clusters lack: nothing may need it."""
    items = k8s.objects(overlay)
    claims = k8s.of_kind(items, "PersistentVolumeClaim")
    claims += [template for workload in k8s.workloads(items) for template in claim_templates(workload)]
    assert claims, f"{overlay}: no claim at all (the stores keep their data on claims)"
    for claim in claims:
        modes = set(claim["spec"]["accessModes"])
        assert modes <= {"ReadWriteOnce", "ReadWriteOncePod"}, f"{overlay}: {claim['metadata']['name']} {modes}"


@overlays
def test_no_volume_is_mounted_by_two_workloads(overlay: str) -> None:
    items = k8s.objects(overlay)
    users: dict[str, set[str]] = defaultdict(set)
    for workload in k8s.workloads(items):
        for volume in k8s.pod_spec(workload).get("volumes") or []:
            if "persistentVolumeClaim" in volume:
                users[volume["persistentVolumeClaim"]["claimName"]].add(workload["metadata"]["name"])
    assert {claim: names for claim, names in users.items() if len(names) > 1} == {}
    for workload in k8s.of_kind(items, "Deployment"):
        claimed = [v for v in k8s.pod_spec(workload).get("volumes") or [] if "persistentVolumeClaim" in v]
        if claimed:  # a ReadWriteOnce claim: one pod at a time, the old one gone before the new one starts
            name = workload["metadata"]["name"]
            assert workload["spec"].get("replicas") == 1, f"{overlay}: {name} would share its claim between pods"
            assert workload["spec"].get("strategy", {}).get("type") == "Recreate", f"{overlay}: {name}"


@overlays
def test_every_shardfuse_pod_keeps_its_data_dir_to_itself(overlay: str) -> None:
    items = k8s.objects(overlay)
    seen = 0
    for workload, container in k8s.shardfuse_containers(items):
        data_dir = str(k8s.container_settings(container).data_dir)
        mounts = [m for m in container.get("volumeMounts") or [] if m["mountPath"] == data_dir]
        if not mounts:
            continue  # it keeps nothing there (Flower: --db on its own volume)
        seen += 1
        (volume,) = [v for v in k8s.pod_spec(workload)["volumes"] if v["name"] == mounts[0]["name"]]
        assert "emptyDir" in volume, f"{overlay}: {workload['metadata']['name']} keeps its data dir on {volume}"
        assert volume["emptyDir"].get("sizeLimit"), f"{workload['metadata']['name']}: bound the cache's disk"
    assert seen >= len(k8s.worker_pools(items)), f"{overlay}: the worker pools mount no data dir"


@overlays
def test_the_object_store_creates_the_bucket_and_sends_nothing_out(overlay: str) -> None:
    items = k8s.objects(overlay)
    stores = [s for s in k8s.of_kind(items, "StatefulSet") if s["metadata"]["name"] == OBJECT_STORE]
    if not stores:
        return  # an overlay on a managed object store
    (server,) = k8s.containers(k8s.pod_spec(stores[0]))
    flags = weed_flags(server)
    assert flags["master.telemetry"] == "false", "SeaweedFS reports usage statistics unless told not to"
    for queue, (deployment,) in k8s.worker_pools(items).items():
        location = k8s.container_settings(k8s.containers(k8s.pod_spec(deployment))[0]).cas.location
        assert isinstance(location, S3Location) and location.bucket == flags["bucket"], f"{overlay}: {queue}"


@overlays
def test_every_worker_reaches_the_cas_in_the_object_store_with_its_keys(overlay: str) -> None:
    items = k8s.objects(overlay)
    for queue, (deployment,) in k8s.worker_pools(items).items():
        (container,) = k8s.containers(k8s.pod_spec(deployment))
        settings = k8s.container_settings(container)
        assert isinstance(settings.cas.location, S3Location), f"{overlay}: {queue} has no s3:// cas.url"
        endpoint = urlsplit(settings.cas.s3.endpoint_url)
        if not (endpoint.hostname and k8s.cluster_name(endpoint.hostname)):
            continue  # AWS S3 itself (no endpoint) or a store outside the cluster
        assert endpoint.port, f"{overlay}: {queue}: cas.s3.endpoint_url {endpoint.geturl()} names no port"
        service, _ = k8s.service_for_host(items, endpoint.hostname, deployment["metadata"]["namespace"])
        assert endpoint.port in {p["port"] for p in service["spec"]["ports"]}, f"{overlay}: {endpoint.geturl()}"
        (store,) = [s for s in k8s.of_kind(items, "StatefulSet")
                    if k8s.selects(service["spec"]["selector"], k8s.pod_labels(s))]  # fmt: skip
        (server,) = k8s.containers(k8s.pod_spec(store))
        assert int(weed_flags(server)["s3.port"]) == endpoint.port, f"{overlay}: {endpoint.geturl()}"
        server_env = k8s.resolved_env(server)
        keys = (settings.cas.s3.access_key_id, settings.cas.s3.secret_access_key.get_secret_value())
        assert keys == (server_env["AWS_ACCESS_KEY_ID"], server_env["AWS_SECRET_ACCESS_KEY"]), f"{overlay}: {queue}"
