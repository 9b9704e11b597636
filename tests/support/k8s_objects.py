"""Reading rendered Kubernetes objects (k8s/ overlays) the way the cluster would use them.

Small queries over parsed manifests for tests/unit/deploy/test_deploy_k8s.py: the workloads and their pod specs,
the shardfuse containers and the pool each one runs, Services and what they select, and a container's
environment with Secret values and ``$(VAR)`` references resolved as the kubelet resolves them.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator, Mapping
from copy import deepcopy
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

from shardfuse.pipeline.config.settings import CONFIG_ENV, Settings
from tests.support.kustomize import render
from tests.support.kustomize_transformers import walk_pod_specs

Obj = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
OVERLAYS = sorted(path.name for path in (K8S / "overlays").iterdir() if path.is_dir())
CONFIG_FILE = REPO / "config" / "k8s.toml"
SECRET_EXAMPLE = K8S / "base" / "secret.example.yaml"
IMAGE = "shardfuse"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "ReplicaSet", "Pod")
# $(VAR) is replaced by the kubelet; $$(VAR) stays literally "$(VAR)".
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def objects(overlay: str) -> list[Obj]:
    """The objects ``kubectl kustomize k8s/overlays/<overlay>`` prints (a fresh copy on every call)."""
    return deepcopy(_rendered(overlay))


@functools.cache
def _rendered(overlay: str) -> list[Obj]:
    return render(K8S / "overlays" / overlay)


def of_kind(items: list[Obj], kind: str) -> list[Obj]:
    return [obj for obj in items if obj["kind"] == kind]


def named(items: list[Obj], kind: str, name: str) -> Obj:
    matches = [obj for obj in of_kind(items, kind) if obj["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} named {name}, found {len(matches)}"
    return matches[0]


def workloads(items: list[Obj]) -> list[Obj]:
    return [obj for obj in items if obj["kind"] in WORKLOAD_KINDS]


def pod_spec(workload: Obj) -> Obj:
    specs = list(walk_pod_specs(workload))
    assert len(specs) == 1, f"{workload['kind']}/{workload['metadata']['name']} has no pod template"
    return specs[0]


def pod_labels(workload: Obj) -> dict[str, str]:
    if workload["kind"] == "Pod":
        return dict(workload["metadata"].get("labels") or {})
    return dict(workload["spec"]["template"]["metadata"].get("labels") or {})


def containers(pod: Obj) -> list[Obj]:
    return list(pod.get("initContainers") or []) + list(pod.get("containers") or [])


def runs_shardfuse(container: Obj) -> bool:
    """Whether the container runs our image (any registry, tag or digest)."""
    name = container.get("image", "").split("@")[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":")[0] == IMAGE


def shardfuse_containers(items: list[Obj]) -> Iterator[tuple[Obj, Obj]]:
    """(workload, container) for every container running the shardfuse image."""
    for workload in workloads(items):
        for container in containers(pod_spec(workload)):
            if runs_shardfuse(container):
                yield workload, container


def worker_pools(items: list[Obj]) -> dict[str, list[Obj]]:
    """Queue name -> the workloads whose container runs ``shardfuse worker <queue>``."""
    pools: dict[str, list[Obj]] = {}
    for workload, container in shardfuse_containers(items):
        args = container.get("args") or []
        if args[:1] == ["worker"] and len(args) > 1:
            pools.setdefault(args[1], []).append(workload)
    return pools


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """A matchLabels / Service selector: every pair present (an empty selector selects nothing here)."""
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


# Secret keys holding JSON (the HTTP API's key hashes, api.keys): a stand-in of that shape.
STRUCTURED_SECRETS = {"api-keys": '[{"name": "placeholder", "sha256": "' + "0" * 64 + '", "read": ["docs"]}]'}


def secret_placeholder(name: str, key: str) -> str:
    """The stand-in value of Secret ``name`` key ``key`` (URL-safe, as the README asks real ones to be; JSON for
    the keys in :data:`STRUCTURED_SECRETS`)."""
    return STRUCTURED_SECRETS.get(key, f"{name}-{key}-value")


def resolved_env(container: Obj) -> dict[str, str]:
    """The container's environment as the kubelet builds it: Secret keys replaced by
    :func:`secret_placeholder`, ``$(VAR)`` expanded from variables defined *earlier* in the list.

    A reference to a variable not defined earlier is an AssertionError: the kubelet would leave the text
    ``$(VAR)`` in place, and shardfuse would receive a URL with a literal ``$(REDIS_PASSWORD)`` in it.
    """
    env: dict[str, str] = {}
    for variable in container.get("env") or []:
        name = variable["name"]
        if "valueFrom" in variable:
            ref = variable["valueFrom"].get("secretKeyRef")
            assert ref is not None, f"{name}: only secretKeyRef is resolved here, not {variable['valueFrom']}"
            env[name] = secret_placeholder(ref["name"], ref["key"])
            continue

        def expand(match: re.Match[str], name: str = name) -> str:
            if match.group(0) == "$$":
                return "$"
            reference = match.group(1)
            assert reference in env, (f"{container['name']}: {name} refers to $({reference}), which is not "
                                      "defined before it in env (Kubernetes would leave it unexpanded)")
            return env[reference]

        env[name] = _REFERENCE.sub(expand, str(variable.get("value", "")))
    return env


def cluster_name(host: str) -> bool:
    """Whether ``host`` is a name the cluster's DNS answers (``svc``, ``pod.svc``, ``svc.ns``, ``….svc``,
    ``….svc.cluster.local``) rather than a host outside it (``redis.example.com``)."""
    return host.count(".") <= 1 or host.endswith((".svc", ".svc.cluster.local"))


def service_for_host(items: list[Obj], host: str, namespace: str) -> tuple[Obj, str | None]:
    """The Service a client reaches at ``host`` from ``namespace``, and the StatefulSet pod named in it
    (``postgres-1.postgres``) if any. Accepts ``svc``, ``svc.ns``, ``svc.ns.svc[.cluster.local]`` and the
    same with a ``<pod>.`` in front."""
    parts = host.split(".")
    for candidate in (parts, parts[1:]):
        if not candidate:
            continue
        service, rest = candidate[0], candidate[1:]
        ns = rest[0] if rest else namespace
        if rest[1:] not in ([], ["svc"], ["svc", "cluster", "local"]):
            continue
        for obj in of_kind(items, "Service"):
            if obj["metadata"]["name"] == service and obj["metadata"].get("namespace", "") == ns:
                return obj, (parts[0] if candidate is not parts else None)
    raise AssertionError(f"no Service answers to {host} from namespace {namespace}")


def url_endpoint(url: str) -> tuple[str, int, str, str]:
    """(host, port, password, path) of a redis:// or postgresql:// URL."""
    parts = urlsplit(url)
    assert parts.hostname and parts.port, f"{url} names no host and port"
    return parts.hostname, parts.port, parts.password or "", parts.path


def container_settings(container: Obj) -> Settings:
    """The settings the container's shardfuse builds: its resolved environment over config/k8s.toml (the
    file SHARDFUSE_CONFIG names in the pod); this process's own ``SHARDFUSE_*`` variables take no part."""
    env = {**resolved_env(container), CONFIG_ENV: str(CONFIG_FILE)}
    with mock.patch.dict(os.environ):
        for name in [name for name in os.environ if name.startswith("SHARDFUSE_")]:
            del os.environ[name]
        os.environ.update({name: value for name, value in env.items() if name.startswith("SHARDFUSE_")})
        return Settings()


def secret_references(items: list[Obj]) -> list[tuple[str, str, str]]:
    """(where, Secret name, key) of every Secret reference in the objects: pods' ``secretKeyRef`` and
    KEDA's ``secretTargetRef``. Whole-Secret references (``envFrom``, volumes) are refused: they name no key
    the example could document."""
    refs = []
    for workload in workloads(items):
        pod = pod_spec(workload)
        where = workload["metadata"]["name"]
        for container in containers(pod):
            assert not any("secretRef" in source for source in container.get("envFrom") or []), where
            for variable in container.get("env") or []:
                if ref := (variable.get("valueFrom") or {}).get("secretKeyRef"):
                    refs.append((f"{where}/{variable['name']}", ref["name"], ref["key"]))
        assert not any("secret" in volume for volume in pod.get("volumes") or []), where
    for auth in of_kind(items, "TriggerAuthentication"):
        refs += [(auth["metadata"]["name"], ref["name"], ref["key"]) for ref in auth["spec"]["secretTargetRef"]]
    return refs
