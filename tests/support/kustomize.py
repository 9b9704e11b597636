"""A small pure-Python renderer of the kustomize subset that k8s/ uses, for machines without kubectl.

``render(path)`` returns the objects ``kubectl kustomize <path>`` would print (as parsed YAML, in no
particular order). It covers exactly what the manifests use and refuses everything else with
:class:`KustomizeError`, so that a new feature in a manifest fails loudly here instead of rendering wrong:

- ``resources``: YAML files (inside the kustomization's folder) and folders holding a kustomization
  (anywhere; built recursively); ``components`` (``kind: Component``), applied on top of what their parent
  holds so far;
- ``configMapGenerator`` / ``secretGenerator`` (``files``, ``literals``, ``envs``; ``behavior: create``),
  ``generatorOptions.disableNameSuffixHash``, and kustomize's content-hash name suffix (computed as
  kustomize's ``api/hasher`` does: sha256 of Go's JSON of ``{data, kind, name: ""}``, whose ``name`` is
  empty because kustomize looks up ``metadata/name`` as one key; its first ten hex digits with
  0→g 1→h 3→k a→m e→t), with references to the generated names rewritten in pod volumes, ``envFrom`` and
  ``env[].valueFrom``;
- ``namespace``; ``labels`` (``includeTemplates``; not ``includeSelectors``);
- ``patches``: JSON 6902 (``add``, ``remove``, ``replace``, ``test``) with a ``target`` (group, version,
  kind, name, namespace, labelSelector, annotationSelector); a target matching nothing is an error here
  (kustomize ignores it), strategic-merge patches are refused;
- ``images`` (``newName``, ``newTag``, ``digest``) and ``replicas``.

Transformers run in kustomize's order (patches, namespace, labels, replicas, images), hash suffixes and
name references last. YAML is read with PyYAML (YAML 1.1: quote ``yes``/``no``/``on``/``off`` meant as
strings, as kustomize reads them as strings); the kubectl comparison test catches any divergence.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.kustomize_transformers import (
    KustomizeError,
    Obj,
    fix_references,
    json_patch,
    label,
    only,
    scale,
    selects,
    set_images,
    set_namespace,
)

__all__ = ["KustomizeError", "content_hash", "render"]

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_FIELDS = frozenset({"apiVersion", "kind", "namespace", "labels", "resources", "components",
                              "configMapGenerator", "secretGenerator", "generatorOptions", "patches", "images",
                              "replicas"})  # fmt: skip


@dataclass
class _Resource:
    obj: Obj
    generated_name: str | None = None  # a generator's name, when the object was generated
    hash_suffix: bool = False

    @property
    def key(self) -> tuple[str, str, str, str]:
        meta = self.obj["metadata"]
        return self.obj["apiVersion"], self.obj["kind"], meta.get("namespace", ""), meta["name"]


def render(path: str | Path) -> list[Obj]:
    """The objects of the kustomization in folder ``path``."""
    resources = _build(Path(path).resolve(), [], component=False)
    renamed: dict[tuple[str, str, str], str] = {}
    for resource in resources:
        if resource.generated_name is not None and resource.hash_suffix:
            meta = resource.obj["metadata"]
            meta["name"] = f"{resource.generated_name}-{content_hash(resource.obj)}"
            renamed[(resource.obj["kind"], meta.get("namespace", ""), resource.generated_name)] = meta["name"]
    for resource in resources:
        fix_references(resource.obj, renamed)
    return [resource.obj for resource in resources]


def content_hash(obj: Obj) -> str:
    """kustomize's name suffix for a generated ConfigMap or Secret (see the module docstring)."""
    encoded: dict[str, Any] = {"kind": obj["kind"], "name": "", "data": obj.get("data", {})}
    if obj["kind"] == "Secret":
        encoded["type"] = obj.get("type", "")
    elif obj.get("binaryData"):
        encoded["binaryData"] = obj["binaryData"]
    text = json.dumps(encoded, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                         ("\u2029", "\\u2029")):  # fmt: skip
        text = text.replace(char, escape)  # Go's json.Marshal escapes these (HTML-safe output)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]
    return digest.translate(str.maketrans("013ae", "ghkmt"))


# -- building one kustomization ---------------------------------------------------------------------------


def _build(folder: Path, accumulated: list[_Resource], *, component: bool) -> list[_Resource]:
    spec = _kustomization(folder)
    kind = spec.get("kind", "Kustomization")
    if kind != ("Component" if component else "Kustomization"):
        raise KustomizeError(f"{folder}: kind {kind} where a {'Component' if component else 'Kustomization'} "
                             "is expected")
    resources = _gather(folder, spec, accumulated)
    _transform(folder, spec, [resource.obj for resource in resources])
    return resources


def _gather(folder: Path, spec: Obj, accumulated: list[_Resource]) -> list[_Resource]:
    """What the kustomization holds before its transformers run: ``accumulated`` (a component's parent's),
    its resources, its components' work on them, and what its generators make."""
    resources = list(accumulated)
    for entry in spec.get("resources") or []:
        target = (folder / entry).resolve()
        if target.is_dir():
            _add(resources, _build(target, [], component=False))
        else:
            _add(resources, [_Resource(obj) for obj in _load_objects(_inside(folder, entry))])
    for entry in spec.get("components") or []:
        resources = _build((folder / entry).resolve(), resources, component=True)
    _add(resources, _generate(folder, spec))
    return resources


def _transform(folder: Path, spec: Obj, objects: list[Obj]) -> None:
    """The kustomization's transformers, in kustomize's order, on ``objects`` (in place)."""
    for patch in spec.get("patches") or []:
        _patch(folder, patch, objects)
    for obj in objects:
        if spec.get("namespace"):
            set_namespace(obj, spec["namespace"])
        for entry in spec.get("labels") or []:
            label(entry, obj)
    for entry in spec.get("replicas") or []:
        scale(entry, objects)
    for image in spec.get("images") or []:
        set_images(objects, image)


def _kustomization(folder: Path) -> Obj:
    for name in KUSTOMIZATION_FILES:
        if (folder / name).is_file():
            spec = yaml.safe_load((folder / name).read_text(encoding="utf-8")) or {}
            unknown = set(spec) - SUPPORTED_FIELDS
            if unknown:
                raise KustomizeError(f"{folder / name}: fields this renderer does not implement: {sorted(unknown)}")
            return dict(spec)
    raise KustomizeError(f"{folder}: no kustomization file ({', '.join(KUSTOMIZATION_FILES)})")


def _inside(folder: Path, entry: str) -> Path:
    """kustomize's load restrictor: a file must be in or below the kustomization's folder."""
    path = (folder / entry).resolve()
    if not path.is_relative_to(folder):
        raise KustomizeError(f"{folder}: {entry} is not in or below the kustomization's folder")
    if not path.is_file():
        raise KustomizeError(f"{folder}: {entry} does not exist")
    return path


def _load_objects(path: Path) -> list[Obj]:
    objects = [obj for obj in yaml.safe_load_all(path.read_text(encoding="utf-8")) if obj is not None]
    for obj in objects:
        if not isinstance(obj, dict) or not obj.get("apiVersion") or not obj.get("kind") or \
                not (obj.get("metadata") or {}).get("name"):
            raise KustomizeError(f"{path}: every document needs apiVersion, kind and metadata.name")
    return objects


def _add(resources: list[_Resource], new: list[_Resource]) -> None:
    keys = {resource.key for resource in resources}
    for resource in new:
        if resource.key in keys:
            raise KustomizeError(f"the resource {'/'.join(resource.key)} is listed twice")
        keys.add(resource.key)
        resources.append(resource)


# -- generators -------------------------------------------------------------------------------------------


def _generate(folder: Path, spec: Obj) -> list[_Resource]:
    options = spec.get("generatorOptions") or {}
    only(options, {"disableNameSuffixHash"}, "generatorOptions")
    generated = []
    for kind, field in (("ConfigMap", "configMapGenerator"), ("Secret", "secretGenerator")):
        for generator in spec.get(field) or []:
            only(generator, {"name", "namespace", "files", "literals", "envs", "type", "behavior", "options"}, field)
            if generator.get("behavior", "create") != "create":
                raise KustomizeError(f"{field} {generator['name']}: only behavior: create is implemented")
            own = generator.get("options") or {}
            only(own, {"disableNameSuffixHash"}, f"{field} options")
            data = _generator_data(folder, generator)
            obj: Obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": generator["name"]}}
            if generator.get("namespace"):
                obj["metadata"]["namespace"] = generator["namespace"]
            if kind == "Secret":
                obj["type"] = generator.get("type", "Opaque")
                data = {key: base64.b64encode(value.encode("utf-8")).decode("ascii") for key, value in data.items()}
            obj["data"] = data
            no_hash = own.get("disableNameSuffixHash", options.get("disableNameSuffixHash", False))
            generated.append(_Resource(obj, generated_name=generator["name"], hash_suffix=not no_hash))
    return generated


def _generator_data(folder: Path, generator: Obj) -> dict[str, str]:
    """A generator's data: its files, literals and env files' entries, in that order; a key given twice is an
    error."""
    data: dict[str, str] = {}
    for key, value in itertools.chain(_file_entries(folder, generator), _literal_entries(generator),
                                      _env_entries(folder, generator)):
        if key in data:
            raise KustomizeError(f"generator {generator['name']}: key {key} is given twice")
        data[key] = value
    return data


def _file_entries(folder: Path, generator: Obj) -> Iterator[tuple[str, str]]:
    """``files``: ``path`` (keyed by the file's name) or ``key=path``."""
    for entry in generator.get("files") or []:
        key, _, source = entry.rpartition("=") if "=" in entry else ("", "", entry)
        path = _inside(folder, source)
        with open(path, encoding="utf-8", newline="") as file:  # the bytes as they are: no newline translation
            yield key or path.name, file.read()


def _literal_entries(generator: Obj) -> Iterator[tuple[str, str]]:
    """``literals``: ``key=value``, one pair of matching quotes around the value dropped."""
    for entry in generator.get("literals") or []:
        key, sep, value = entry.partition("=")
        if not sep:
            raise KustomizeError(f"generator {generator['name']}: literal {entry!r} is not key=value")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        yield key, value


def _env_entries(folder: Path, generator: Obj) -> Iterator[tuple[str, str]]:
    """``envs``: files of ``key=value`` lines; blank lines and ``#`` comments skipped."""
    for entry in generator.get("envs") or []:
        for line in _inside(folder, entry).read_text(encoding="utf-8").splitlines():
            line = line.lstrip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise KustomizeError(f"{entry}: {line!r} is not key=value")
            yield key, value


# -- patches ----------------------------------------------------------------------------------------------


def _patch(folder: Path, entry: Obj, objects: list[Obj]) -> None:
    only(entry, {"path", "patch", "target"}, "patches")
    text = _inside(folder, entry["path"]).read_text(encoding="utf-8") if "path" in entry else entry.get("patch", "")
    operations = yaml.safe_load(text)
    if not isinstance(operations, list):
        raise KustomizeError(f"{folder}: strategic-merge patches are not implemented here; use a JSON 6902 "
                             "patch (a list of operations) with a target")
    if "target" not in entry:
        raise KustomizeError(f"{folder}: a JSON 6902 patch needs a target")
    matched = [obj for obj in objects if selects(entry["target"], obj)]
    if not matched:
        raise KustomizeError(f"{folder}: the patch target {entry['target']} matches no resource")
    for obj in matched:
        for operation in operations:
            json_patch(obj, operation)
