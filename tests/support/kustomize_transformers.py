"""The transformers of :mod:`tests.support.kustomize`: each changes plain parsed objects in place.

JSON 6902 patches with a target, the namespace, labels, replicas, images, and the rewriting of references
to generated (hash-suffixed) ConfigMap and Secret names. Anything kustomize would do that is not
implemented here raises :class:`KustomizeError` rather than being skipped.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Iterator
from typing import Any

__all__ = ["KustomizeError", "Obj", "fix_references", "json_patch", "label", "only", "scale", "selects",
           "set_images", "set_namespace"]  # fmt: skip

Obj = dict[str, Any]
# Kinds without a namespace (kustomize's namespace transformer leaves them alone).
CLUSTER_SCOPED = frozenset({"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                            "PersistentVolume", "StorageClass", "PriorityClass", "IngressClass",
                            "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "APIService",
                            "ClusterTriggerAuthentication", "Node", "RuntimeClass", "CSIDriver"})  # fmt: skip
# Where ``labels: [{includeTemplates: true}]`` also writes (kustomize's metadataLabelsFieldSpecs).
TEMPLATE_LABEL_PATHS: dict[str, tuple[tuple[str, ...], ...]] = {
    "Deployment": (("spec", "template"),), "ReplicaSet": (("spec", "template"),),
    "DaemonSet": (("spec", "template"),), "StatefulSet": (("spec", "template"), ("spec", "volumeClaimTemplates[]")),
    "Job": (("spec", "template"),), "ReplicationController": (("spec", "template"),),
    "CronJob": (("spec", "jobTemplate"), ("spec", "jobTemplate", "spec", "template")),
}  # fmt: skip
SCALABLE = frozenset({"Deployment", "ReplicaSet", "StatefulSet", "ReplicationController"})
# Where a pod spec sits: in the template of a workload, in a CronJob's job template (a Pod: its spec).
TEMPLATE_POD_SPECS: tuple[tuple[str, ...], ...] = (
    ("spec", "template", "spec"), ("spec", "jobTemplate", "spec", "template", "spec"),
)


class KustomizeError(Exception):
    """The kustomization is wrong, or uses something this renderer does not implement."""


def only(mapping: Obj, allowed: set[str], where: str) -> None:
    """Refuse fields this renderer does not implement (rather than ignore them)."""
    unknown = set(mapping) - allowed
    if unknown:
        raise KustomizeError(f"{where}: fields this renderer does not implement: {sorted(unknown)}")


# -- patches ----------------------------------------------------------------------------------------------


def selects(target: Obj, obj: Obj) -> bool:
    """Whether a patch ``target`` picks ``obj`` (kind, name and namespace are anchored regular expressions)."""
    only(target, {"group", "version", "kind", "name", "namespace", "labelSelector", "annotationSelector"}, "target")
    group, _, version = obj["apiVersion"].rpartition("/")
    meta = obj["metadata"]
    checks = [
        ("group", group), ("version", version), ("kind", obj["kind"]), ("name", meta["name"]),
        ("namespace", meta.get("namespace", "")),
    ]  # fmt: skip
    if any(field in target and not re.fullmatch(target[field], value) for field, value in checks):
        return False
    return _matches_selector(target.get("labelSelector"), meta.get("labels") or {}) and _matches_selector(
        target.get("annotationSelector"), meta.get("annotations") or {}
    )


def _matches_selector(selector: str | None, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector string: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``,
    ``k notin (a,b)``, comma-separated (all must hold)."""
    if not selector:
        return True
    for term in re.findall(r"[^,(]+(?:\([^)]*\))?", selector):
        term = term.strip()
        if match := re.fullmatch(r"(\S+)\s+(in|notin)\s+\(([^)]*)\)", term):
            key, op, values = match.group(1), match.group(2), {v.strip() for v in match.group(3).split(",")}
            if (labels.get(key) in values) != (op == "in"):
                return False
        elif match := re.fullmatch(r"([^!=\s]+)\s*(==|=|!=)\s*(\S*)", term):
            key, op, value = match.groups()
            if (labels.get(key) == value) != (op != "!="):
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def json_patch(obj: Obj, operation: Obj) -> None:
    """Apply one RFC 6902 operation (add, remove, replace, test) to ``obj``."""
    op, path = operation.get("op"), operation.get("path", "")
    parts = [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]]
    if not parts:
        raise KustomizeError(f"JSON patch path {path!r} must point inside the object")
    parent = _patch_parent(obj, parts, f"JSON patch {op}: {path} does not exist in {obj['metadata']['name']}")
    last = parts[-1]
    if op == "add":
        value = copy.deepcopy(operation["value"])
        if isinstance(parent, list):
            parent.insert(len(parent) if last == "-" else int(last), value)
        else:
            parent[last] = value
    elif op in ("remove", "replace", "test"):
        index: Any = int(last) if isinstance(parent, list) else last
        try:
            current = parent[index]
        except (KeyError, IndexError):
            raise KustomizeError(f"JSON patch {op}: {path} does not exist in {obj['metadata']['name']}") from None
        if op == "remove":
            del parent[index]
        elif op == "replace":
            parent[index] = copy.deepcopy(operation["value"])
        elif current != operation["value"]:
            raise KustomizeError(f"JSON patch test failed at {path} of {obj['metadata']['name']}")
    else:
        raise KustomizeError(f"JSON patch op {op!r} is not implemented here")


def _patch_parent(obj: Obj, parts: list[str], missing: str) -> Any:
    """The list or mapping holding the node that ``parts`` (a JSON pointer's steps) names; ``missing`` is the
    error when a step on the way does not exist."""
    parent: Any = obj
    try:
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
    except (KeyError, IndexError, ValueError):
        raise KustomizeError(missing) from None
    return parent


# -- namespace, labels, replicas, images ------------------------------------------------------------------


def set_namespace(obj: Obj, namespace: str) -> None:
    if obj["kind"] not in CLUSTER_SCOPED:
        obj["metadata"]["namespace"] = namespace


def label(entry: Obj, obj: Obj) -> None:
    """One item of a kustomization's ``labels``."""
    only(entry, {"pairs", "includeSelectors", "includeTemplates"}, "labels")
    if entry.get("includeSelectors"):
        raise KustomizeError("labels with includeSelectors: true are not implemented here")
    pairs = {str(key): str(value) for key, value in (entry.get("pairs") or {}).items()}
    obj["metadata"].setdefault("labels", {}).update(pairs)
    if entry.get("includeTemplates"):
        for path in TEMPLATE_LABEL_PATHS.get(obj["kind"], ()):
            for node in walk(obj, path):
                node.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)


def walk(node: Any, path: tuple[str, ...]) -> Iterator[Obj]:
    """The mappings at ``path`` (``name[]`` steps into every item of a list)."""
    if not path:
        if isinstance(node, dict):
            yield node
        return
    head, rest = path[0], path[1:]
    if not isinstance(node, dict):
        return
    if head.endswith("[]"):
        for item in node.get(head[:-2]) or []:
            yield from walk(item, rest)
    elif head in node:
        yield from walk(node[head], rest)


def scale(entry: Obj, objects: list[Obj]) -> None:
    """One item of ``replicas``: the count of every workload of that name."""
    only(entry, {"name", "count"}, "replicas")
    targets = [obj for obj in objects if obj["kind"] in SCALABLE and obj["metadata"]["name"] == entry["name"]]
    if not targets:
        raise KustomizeError(f"replicas: no Deployment, StatefulSet or ReplicaSet is named {entry['name']}")
    for obj in targets:
        obj.setdefault("spec", {})["replicas"] = int(entry["count"])


def set_images(node: Any, image: Obj) -> None:
    """One item of ``images``, applied to every container and init container found in ``node``."""
    only(image, {"name", "newName", "newTag", "digest"}, "images")
    if isinstance(node, list):
        for item in node:
            set_images(item, image)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers") and isinstance(value, list):
                for container in value:
                    if isinstance(container, dict) and isinstance(container.get("image"), str):
                        container["image"] = _retag(container["image"], image)
            set_images(value, image)


def _retag(reference: str, image: Obj) -> str:
    name, at, digest = reference.partition("@")
    tag = ""
    if ":" in name.rsplit("/", 1)[-1]:  # a colon before the last slash is a registry's port
        name, tag = name.rsplit(":", 1)
    if name != image["name"]:
        return reference
    name = str(image.get("newName", name))
    if image.get("digest"):
        return f"{name}@{image['digest']}"
    if image.get("newTag"):
        return f"{name}:{image['newTag']}"
    return name + (f":{tag}" if tag else "") + (f"@{digest}" if at else "")


# -- references to generated names ------------------------------------------------------------------------


# A reference to a generated object: the kind it names, the mapping holding the name, the name's field.
_Reference = tuple[str, Obj, str]
# Per holder: the key of each reference it may hold, and the kind that reference names.
_PROJECTED_SOURCES = (("configMap", "ConfigMap"), ("secret", "Secret"))
_ENV_FROM = (("configMapRef", "ConfigMap"), ("secretRef", "Secret"))
_VALUE_FROM = (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret"))


def fix_references(obj: Obj, renamed: dict[tuple[str, str, str], str]) -> None:
    """Point ``obj``'s pod references at the final names of generated objects.

    ``renamed`` maps (kind, namespace, generator name) to the suffixed name; only objects of the same
    namespace refer to each other.
    """
    namespace = obj["metadata"].get("namespace", "")
    for pod in walk_pod_specs(obj):
        for kind, holder, field in itertools.chain(_pod_references(pod), _container_references(pod)):
            new = renamed.get((kind, namespace, holder.get(field, "")))
            if new is not None:
                holder[field] = new


def _pod_references(pod: Obj) -> Iterator[_Reference]:
    """The references of a pod's volumes (direct and projected) and image pull secrets."""
    for volume in pod.get("volumes") or []:
        if "configMap" in volume:
            yield "ConfigMap", volume["configMap"], "name"
        if "secret" in volume:
            yield "Secret", volume["secret"], "secretName"
        for source in (volume.get("projected") or {}).get("sources") or []:
            yield from _named(source, _PROJECTED_SOURCES)
    for secret in pod.get("imagePullSecrets") or []:
        yield "Secret", secret, "name"


def _container_references(pod: Obj) -> Iterator[_Reference]:
    """The references of a pod's containers and init containers: ``envFrom`` and ``env[].valueFrom``."""
    for container in (pod.get("containers") or []) + (pod.get("initContainers") or []):
        for source in container.get("envFrom") or []:
            yield from _named(source, _ENV_FROM)
        for variable in container.get("env") or []:
            yield from _named(variable.get("valueFrom") or {}, _VALUE_FROM)


def _named(holder: Obj, keys: tuple[tuple[str, str], ...]) -> Iterator[_Reference]:
    for key, kind in keys:
        if key in holder:
            yield kind, holder[key], "name"


def walk_pod_specs(obj: Obj) -> Iterator[Obj]:
    """The pod specs inside ``obj`` (a Pod's spec, a workload's template, a CronJob's job template)."""
    for path in (("spec",),) if obj["kind"] == "Pod" else TEMPLATE_POD_SPECS:
        yield from walk(obj, path)
