"""The Kubernetes manifests (k8s/): every overlay renders, validates, and hands shardfuse what it accepts.

Rendering uses tests/support/kustomize.py (no kubectl on CI); where kubectl is installed, the last tests
check that it renders the same objects. Kubernetes objects are validated offline against the schemas of
the ``kubernetes-validate`` package, KEDA's against its vendored CRDs (tests/schemas/SOURCE.md). Storage (no
volume shared, the CAS in the object store): test_deploy_k8s_storage.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardfuse.pipeline.config.settings import CONFIG_ENV
from shardfuse.workers.names import Queue
from shardfuse.workers.stack.celery_processes import CONCURRENCY
from tests.support import k8s_objects as k8s
from tests.support import redis_memory
from tests.support.deployment import POOLS, check_config_file, check_env, cli_check, hard_limit_s
from tests.support.k8s_schemas import schema_errors
from tests.support.kustomize import KustomizeError, content_hash, render
from tests.support.paths import REPO

# Which autoscaler each overlay is documented to use (k8s/README.md).
AUTOSCALER = {"small": "ScaledObject", "multi-shard": "HorizontalPodAutoscaler"}
overlays = pytest.mark.parametrize("overlay", k8s.OVERLAYS)


def test_the_documented_overlays_exist() -> None:
    assert set(AUTOSCALER) <= set(k8s.OVERLAYS)


# -- schemas ---------------------------------------------------------------------------------------------


@overlays
def test_every_object_matches_its_schema(overlay: str) -> None:
    for obj in k8s.objects(overlay):
        errors = schema_errors(obj)
        assert not errors, f"{overlay}: {obj['kind']}/{obj['metadata']['name']}: {errors}"


def test_the_secret_example_matches_its_schema() -> None:
    (secret,) = [doc for doc in yaml.safe_load_all(k8s.SECRET_EXAMPLE.read_text()) if doc]
    assert schema_errors(secret) == []


# -- what shardfuse is given -----------------------------------------------------------------------------


def test_the_settings_file_loads_and_is_what_the_configmap_holds() -> None:
    check_config_file(k8s.CONFIG_FILE)
    for overlay in k8s.OVERLAYS:
        items = k8s.objects(overlay)
        (configmap,) = [obj for obj in k8s.of_kind(items, "ConfigMap") if obj["metadata"]["name"].startswith(
            "shardfuse-config-")]
        assert configmap["data"] == {"shardfuse.toml": k8s.CONFIG_FILE.read_text()}
        for workload, container in k8s.shardfuse_containers(items):
            # SHARDFUSE_CONFIG names the file the ConfigMap's volume puts there.
            config = Path(k8s.resolved_env(container)[CONFIG_ENV])
            volumes = {v["name"]: v for v in k8s.pod_spec(workload).get("volumes") or []}
            mounts = [m for m in container.get("volumeMounts") or [] if m["mountPath"] == str(config.parent)]
            assert len(mounts) == 1, f"{workload['metadata']['name']}: nothing mounted at {config.parent}"
            assert volumes[mounts[0]["name"]].get("configMap", {}).get("name") == configmap["metadata"]["name"]
            assert "items" not in volumes[mounts[0]["name"]]["configMap"] and config.name == "shardfuse.toml"


@overlays
def test_container_commands_are_shardfuse_commands(overlay: str) -> None:
    for workload, container in k8s.shardfuse_containers(k8s.objects(overlay)):
        assert "command" not in container, f"{workload['metadata']['name']}: the image's entrypoint is shardfuse"
        cli_check(container["args"])
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = container.get(probe, {}).get("exec", {}).get("command")
            if command:
                assert command[0] == "shardfuse", command
                cli_check(command[1:])


@overlays
def test_the_environment_is_settings_shardfuse_accepts(overlay: str) -> None:
    for _, container in k8s.shardfuse_containers(k8s.objects(overlay)):
        literal = {v["name"]: v["value"] for v in container.get("env") or [] if "value" in v}
        check_env(literal, config_file=k8s.CONFIG_FILE)
        # Resolved as the kubelet does (Secrets in, $(VAR) expanded): the values themselves must be valid,
        # e.g. postgres.shard_dsns a JSON list with one DSN per shard.
        check_env(k8s.resolved_env(container), config_file=k8s.CONFIG_FILE)


@overlays
def test_clients_reach_the_stores_with_their_passwords(overlay: str) -> None:
    items = k8s.objects(overlay)
    # The password each in-cluster store was started with (an overlay using managed stores has none here).
    servers = {name: k8s.resolved_env(k8s.pod_spec(store)["containers"][0])[variable]
               for store in k8s.of_kind(items, "StatefulSet")
               for name, variable in (("redis", "REDIS_PASSWORD"), ("postgres", "POSTGRES_PASSWORD"))
               if store["metadata"]["name"] == name}  # fmt: skip
    for workload, container in k8s.shardfuse_containers(items):
        settings = k8s.container_settings(container)
        urls = [settings.broker.url, settings.broker.result_backend]
        if workload["metadata"]["name"] != "flower":
            urls += [settings.postgres.dsn] + [settings.shard_dsn(shard) for shard in range(settings.shards)]
        for url in urls:
            host, port, given, _ = k8s.url_endpoint(url)
            if not k8s.cluster_name(host):
                continue  # a managed service outside the cluster
            service, pod = k8s.service_for_host(items, host, workload["metadata"]["namespace"])
            assert port in {p["port"] for p in service["spec"]["ports"]}, f"{overlay}: {url} (port)"
            (store,) = [s for s in k8s.of_kind(items, "StatefulSet")
                        if k8s.selects(service["spec"]["selector"], k8s.pod_labels(s))]
            assert given == servers[store["metadata"]["name"]], f"{overlay}: {host} is given another password"
            if pod is not None:  # a StatefulSet pod by name (postgres-1.postgres): it must run
                ordinal = int(pod.rsplit("-", 1)[1])
                assert pod == f"{store['metadata']['name']}-{ordinal}", f"{overlay}: {host}"
                assert ordinal < store["spec"].get("replicas", 1), f"{overlay}: {host} names a pod that does not run"


@overlays
def test_redis_refuses_writes_below_its_memory_limit_and_caches_fit_in_it(overlay: str) -> None:
    """At maxmemory Redis refuses writes (noeviction) before the pod's memory limit (the OOM killer would lose
    acknowledged writes); every shardfuse container's caches at their bounds take only a share of it."""
    items = k8s.objects(overlay)
    stores = [s for s in k8s.of_kind(items, "StatefulSet") if s["metadata"]["name"] == "redis"]
    if not stores:
        return  # an overlay on a managed Redis: its maxmemory is the provider's (docs/operations.md)
    (container,) = k8s.containers(k8s.pod_spec(stores[0]))
    options = redis_memory.redis_options(container["args"])
    assert options["maxmemory-policy"] == "noeviction"
    maxmemory = redis_memory.redis_bytes(options["maxmemory"])
    limit = redis_memory.k8s_bytes(container["resources"]["limits"]["memory"])
    assert maxmemory <= redis_memory.MAXMEMORY_SHARE * limit
    for _workload, shardfuse in k8s.shardfuse_containers(items):
        assert redis_memory.cache_bound_bytes(k8s.container_settings(shardfuse)) <= (
            redis_memory.CACHE_SHARE * maxmemory)


@overlays
def test_each_queue_has_one_deployment_that_outlives_its_tasks(overlay: str) -> None:
    items = k8s.objects(overlay)
    pools = k8s.worker_pools(items)
    assert sorted(pools) == sorted(q.value for q in Queue)
    for queue in Queue:
        (deployment,) = pools[queue.value]
        assert deployment["kind"] == "Deployment"
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        limit = hard_limit_s(queue, k8s.container_settings(container))
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert grace > limit, f"{overlay}: {queue} pods are killed after {grace}s, its tasks may run {limit}s"


@overlays
def test_probes_ping_their_own_pool(overlay: str) -> None:
    for queue, (deployment,) in k8s.worker_pools(k8s.objects(overlay)).items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        for name in ("startupProbe", "readinessProbe", "livenessProbe"):
            command = container[name]["exec"]["command"]
            assert command[:3] == ["shardfuse", "ping", queue], f"{queue} {name}: {command}"
            timeout = float(command[command.index("--timeout") + 1]) if "--timeout" in command else 5.0
            assert container[name].get("timeoutSeconds", 1) > timeout, f"{queue} {name} is cut off before ping"


@overlays
def test_each_pool_has_a_disruption_budget_and_one_autoscaler(overlay: str) -> None:
    items = k8s.objects(overlay)
    budgets = k8s.of_kind(items, "PodDisruptionBudget")
    autoscalers = k8s.of_kind(items, "ScaledObject") + k8s.of_kind(items, "HorizontalPodAutoscaler")
    kinds = {obj["kind"] for obj in autoscalers}
    assert len(kinds) == 1, f"{overlay} uses {kinds or 'no autoscaler'}: pick one component"
    assert kinds == {AUTOSCALER.get(overlay, *kinds)}, f"{overlay} is documented to use {AUTOSCALER[overlay]}"
    for queue, (deployment,) in k8s.worker_pools(items).items():
        labels = k8s.pod_labels(deployment)
        mine = [b for b in budgets if k8s.selects(b["spec"]["selector"]["matchLabels"], labels)]
        assert len(mine) == 1, f"{overlay}: {queue} has {len(mine)} PodDisruptionBudgets"
        assert mine[0]["spec"].get("maxUnavailable", 0) >= 1, f"{queue}: its budget would block node drains"
        targets = [a for a in autoscalers if a["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
                   and a["spec"]["scaleTargetRef"].get("kind", "Deployment") == "Deployment"]
        assert len(targets) == 1, f"{overlay}: {queue} has {len(targets)} autoscalers"
        assert "replicas" not in deployment["spec"], f"{queue}: spec.replicas would fight the autoscaler"


@overlays
def test_postgres_accepts_every_connection_at_the_autoscalers_maxima(overlay: str) -> None:
    items = k8s.objects(overlay)
    autoscalers = k8s.of_kind(items, "ScaledObject") + k8s.of_kind(items, "HorizontalPodAutoscaler")
    connections = 0  # per server: every worker process pools connections to each server it uses
    for queue, (deployment,) in k8s.worker_pools(items).items():
        (scaler,) = [a for a in autoscalers if a["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]]
        pods = scaler["spec"].get("maxReplicaCount", scaler["spec"].get("maxReplicas", 100))
        settings = k8s.container_settings(deployment["spec"]["template"]["spec"]["containers"][0])
        processes = CONCURRENCY[Queue(queue)](settings.workers) if POOLS[Queue(queue)] == "prefork" else 1
        connections += pods * processes * settings.postgres.pool_max_size
    for server in [s for s in k8s.of_kind(items, "StatefulSet") if s["metadata"]["name"] == "postgres"]:
        args = k8s.pod_spec(server)["containers"][0].get("args") or []
        limit = int(next((a.split("=")[1] for a in args if a.startswith("max_connections=")), "100"))
        assert connections < limit, f"{overlay}: workers may open {connections} connections, PostgreSQL takes {limit}"


@overlays
def test_postgres_runs_a_pgvector_release_with_iterative_scans(overlay: str) -> None:
    """A pinned pgvector 0.8+ image (iterative index scans for filtered searches, halfvec) on PostgreSQL 16, the
    embedded stack's major version (a data dir moves between them with pg_dump only across major versions)."""
    servers = [s for s in k8s.of_kind(k8s.objects(overlay), "StatefulSet") if s["metadata"]["name"] == "postgres"]
    assert servers, overlay
    for server in servers:
        image = k8s.pod_spec(server)["containers"][0]["image"]
        match = re.fullmatch(r"pgvector/pgvector:(\d+)\.(\d+)\.(\d+)-pg16", image)
        assert match and tuple(map(int, match.groups())) >= (0, 8, 0), image


def test_keda_triggers_measure_the_queue_of_their_deployment() -> None:
    scaled = [(overlay, obj) for overlay in k8s.OVERLAYS for obj in k8s.of_kind(k8s.objects(overlay), "ScaledObject")]
    assert scaled, "no overlay uses KEDA"
    for overlay, obj in scaled:
        items = k8s.objects(overlay)
        namespace = obj["metadata"]["namespace"]
        deployment = k8s.named(items, "Deployment", obj["spec"]["scaleTargetRef"]["name"])
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        (trigger,) = obj["spec"]["triggers"]
        meta = trigger["metadata"]
        assert trigger["type"] == "redis" and meta["listName"] == container["args"][1], obj["metadata"]["name"]
        assert meta["listName"] in {queue.value for queue in Queue}
        # The list KEDA reads is the one the pods consume: same Redis server, database and password.
        broker_host, broker_port, password, database = k8s.url_endpoint(k8s.container_settings(container).broker.url)
        host, _, port = meta["address"].rpartition(":")
        if k8s.cluster_name(host) or k8s.cluster_name(broker_host):
            assert k8s.service_for_host(items, host, namespace) == k8s.service_for_host(items, broker_host, namespace)
        else:
            assert host == broker_host, f"{overlay}: KEDA watches {host}, the pods use {broker_host}"
        assert int(port) == broker_port and meta.get("databaseIndex", "0") == (database.lstrip("/") or "0")
        auth = k8s.named(items, "TriggerAuthentication", trigger["authenticationRef"]["name"])
        (ref,) = [ref for ref in auth["spec"]["secretTargetRef"] if ref["parameter"] == "password"]
        assert k8s.secret_placeholder(ref["name"], ref["key"]) == password


def test_secret_references_name_documented_keys() -> None:
    (example,) = [doc for doc in yaml.safe_load_all(k8s.SECRET_EXAMPLE.read_text()) if doc]
    documented = set(example["stringData"])
    for doc in (k8s.K8S / "README.md", k8s.SECRET_EXAMPLE):  # the documented `kubectl create secret`
        text = doc.read_text().replace("\n#", "\n")
        commands = re.findall(r"kubectl [^\n]*create secret generic shardfuse-secrets(?:[^\n]*\\\n)*[^\n]*", text)
        assert commands, f"{doc} shows no `kubectl create secret generic shardfuse-secrets` command"
        for command in commands:
            assert set(re.findall(r"--from-literal=([\w-]+)=", command)) == documented, f"{doc}: {command}"
    for overlay in k8s.OVERLAYS:
        items = k8s.objects(overlay)
        assert not k8s.of_kind(items, "Secret"), f"{overlay} would overwrite the hand-made Secret"
        for where, name, key in k8s.secret_references(items):
            assert (name, key) in {(example["metadata"]["name"], k) for k in documented}, f"{overlay}: {where}"


# -- pods, volumes, services -----------------------------------------------------------------------------


@overlays
def test_every_volume_mount_has_a_volume_and_every_claim_exists(overlay: str) -> None:
    items = k8s.objects(overlay)
    claims = {obj["metadata"]["name"] for obj in k8s.of_kind(items, "PersistentVolumeClaim")}
    configmaps = {obj["metadata"]["name"] for obj in k8s.of_kind(items, "ConfigMap")}
    for workload in k8s.workloads(items):
        pod = k8s.pod_spec(workload)
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        templates = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates") or []}
        for container in k8s.containers(pod):
            for mount in container.get("volumeMounts") or []:
                assert mount["name"] in volumes.keys() | templates, f"{workload['metadata']['name']}: {mount}"
        for volume in volumes.values():
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, volume
            if "configMap" in volume:
                assert volume["configMap"]["name"] in configmaps, volume


@overlays
def test_flower_keeps_its_database_on_a_volume_behind_the_ingress(overlay: str) -> None:
    items = k8s.objects(overlay)
    flower = k8s.named(items, "Deployment", "flower")
    (container,) = flower["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[0] == "flower"
    database = Path(args[args.index("--db") + 1])
    assert str(database.parent) in {m["mountPath"] for m in container["volumeMounts"]}
    password = next(v for v in container["env"] if v["name"] == "SHARDFUSE_FLOWER__PASSWORD")
    assert "secretKeyRef" in password["valueFrom"], "Flower's password must come from the Secret"
    port = int(args[args.index("--port") + 1])
    for ingress in k8s.of_kind(items, "Ingress"):
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                service = k8s.named(items, "Service", backend["name"])
                (exposed,) = [p for p in service["spec"]["ports"] if p.get("name") == backend["port"].get("name")
                              or p["port"] == backend["port"].get("number")]
                target = exposed["targetPort"]
                assert target in (port, next(p["name"] for p in container["ports"] if p["containerPort"] == port))


@overlays
def test_services_select_pods_that_exist(overlay: str) -> None:
    items = k8s.objects(overlay)
    for service in k8s.of_kind(items, "Service"):
        pods = [w for w in k8s.workloads(items) if k8s.selects(service["spec"]["selector"], k8s.pod_labels(w))]
        assert pods, f"{overlay}: Service {service['metadata']['name']} selects no pod"
        ports = [p for w in pods for c in k8s.containers(k8s.pod_spec(w)) for p in c.get("ports") or []]
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            assert any(target in (p["containerPort"], p.get("name")) for p in ports), f"{service['metadata']}"


@overlays
def test_no_container_runs_as_root(overlay: str) -> None:
    for workload in k8s.workloads(k8s.objects(overlay)):
        pod = k8s.pod_spec(workload)
        for container in k8s.containers(pod):
            context = {**(pod.get("securityContext") or {}), **(container.get("securityContext") or {})}
            where = f"{workload['metadata']['name']}/{container['name']}"
            assert context.get("runAsNonRoot") is True and context.get("runAsUser", 1) != 0, where
            assert (container.get("securityContext") or {}).get("allowPrivilegeEscalation") is False, where


# -- the renderer against kustomize itself ---------------------------------------------------------------


def test_hash_suffixes_are_kustomizes() -> None:
    # Known answers of kustomize v5.5.0 (`kubectl kustomize`) for these generated objects.
    configmap = {"kind": "ConfigMap", "data": {"x.toml": "a = 1\n"}}
    secret = {"kind": "Secret", "type": "Opaque", "data": {"user": "YWRtaW4="}}
    assert (content_hash(configmap), content_hash(secret)) == ("8f2kk4fk87", "hmbb7mfmdf")


def test_the_renderer_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: [deploy.yaml]\nnamePrefix: x-\n")
    with pytest.raises(KustomizeError, match="namePrefix"):
        render(tmp_path)
    (tmp_path / "kustomization.yaml").write_text("resources: [deploy.yaml]\npatches: [{path: p.yaml}]\n")
    (tmp_path / "deploy.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")
    (tmp_path / "p.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {k: v}\n")
    with pytest.raises(KustomizeError, match="strategic-merge"):
        render(tmp_path)


KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (the renderer stands in)")


def kubectl_kustomize(path: Path) -> dict[tuple[str, ...], Any]:
    out = subprocess.run([KUBECTL or "kubectl", "kustomize", str(path)], capture_output=True, text=True, check=True)
    return by_id([doc for doc in yaml.safe_load_all(out.stdout) if doc])


def by_id(items: list[dict[str, Any]]) -> dict[tuple[str, ...], Any]:
    ids = [(o["apiVersion"], o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in items]
    assert len(set(ids)) == len(ids)
    return dict(zip(ids, items, strict=True))


@needs_kubectl
@pytest.mark.parametrize("path", [f"overlays/{name}" for name in k8s.OVERLAYS] + ["base", "stores"])
def test_kubectl_renders_what_the_renderer_renders(path: str) -> None:
    assert by_id(render(k8s.K8S / path)) == kubectl_kustomize(k8s.K8S / path)


@needs_kubectl
def test_kubectl_agrees_on_the_renderers_other_features(tmp_path: Path) -> None:
    fixture = REPO / "tests" / "fixtures" / "kustomize"
    shutil.copytree(fixture, tmp_path / "k")
    (tmp_path / "k" / "app.conf").write_bytes(b'a <b> & "c" \xc3\xa9\n\ttab\r\nend')  # CRLF kept as is
    assert by_id(render(tmp_path / "k")) == kubectl_kustomize(tmp_path / "k")
