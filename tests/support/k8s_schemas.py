"""Offline schema validation of rendered Kubernetes objects.

Kubernetes' own kinds against the OpenAPI schemas bundled by ``kubernetes-validate`` (strict: unknown
fields are errors), KEDA's ScaledObject and TriggerAuthentication against the openAPIV3Schema of KEDA's CRDs
vendored in tests/schemas (see SOURCE.md there), made strict the same way.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

__all__ = ["KUBERNETES_VERSION", "schema_errors"]

KUBERNETES_VERSION = "1.32"
SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"
KEDA_CRDS = {"ScaledObject": "keda.sh_scaledobjects.yaml",
             "TriggerAuthentication": "keda.sh_triggerauthentications.yaml"}  # fmt: skip


def schema_errors(obj: dict[str, Any]) -> list[str]:
    """What is wrong with ``obj`` by its kind's schema (empty: valid); a kind without a schema is an error."""
    if obj["kind"] in KEDA_CRDS:
        if obj["apiVersion"] != "keda.sh/v1alpha1":
            return [f"apiVersion {obj['apiVersion']}: the vendored CRD is keda.sh/v1alpha1"]
        return [f"{list(e.path)}: {e.message}" for e in _keda_validator(obj["kind"]).iter_errors(obj)]
    try:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{list(exc.path)}: {exc.message}"]
    except kubernetes_validate.SchemaNotFoundError as exc:
        return [exc.message]
    return []


@functools.cache
def _keda_validator(kind: str) -> jsonschema.protocols.Validator:
    crd = next(doc for doc in yaml.safe_load_all((SCHEMAS / KEDA_CRDS[kind]).read_text(encoding="utf-8")) if doc)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    return jsonschema.Draft7Validator(_strict(version["schema"]["openAPIV3Schema"]))


def _strict(schema: Any) -> Any:
    """The CRD schema with undeclared fields refused, as the API server's strict field validation does
    (``kubectl apply`` since Kubernetes 1.27)."""
    if isinstance(schema, dict):
        schema = {key: _strict(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema and \
                not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [_strict(item) for item in schema]
    return schema
