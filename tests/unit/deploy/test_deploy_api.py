"""The HTTP API in docker-compose.yml and k8s/: served where its probes and its published port point, probed on
/readyz (stores answer) and /healthz (the process), its keys taken from the environment (compose: API_KEYS in
.env) or the Secret (k8s: ``api-keys``) as hashes, and needing no shared volume."""

from __future__ import annotations

from typing import Any

import pytest

from shardfuse.workers.cli.main import build_parser
from tests.support import k8s_objects as k8s
from tests.support.compose_file import load, service_settings, volume_mounts
from tests.support.deployment import cli_check

overlays = pytest.mark.parametrize("overlay", k8s.OVERLAYS)


def _listen_port(args: list[str]) -> int:
    """The port ``shardfuse api ...`` listens on (as the real parser reads it)."""
    parsed = build_parser().parse_args(args)
    assert parsed.command == "api"
    return int(parsed.port)


@pytest.fixture(scope="module")
def compose_api() -> dict[str, Any]:
    return load()["services"]["api"]


def test_compose_serves_the_api_on_the_port_it_publishes_and_probes(compose_api: dict[str, Any]) -> None:
    cli_check(compose_api["command"])
    port = _listen_port(compose_api["command"])
    assert [str(entry).rsplit(":", 1)[-1] for entry in compose_api["ports"]] == [str(port)]
    assert f"http://127.0.0.1:{port}/readyz" in " ".join(compose_api["healthcheck"]["test"])
    assert {name: dep["condition"] for name, dep in compose_api["depends_on"].items()} == dict.fromkeys(
        ("redis", "postgres", "seaweedfs"), "service_healthy")


def test_compose_api_keys_come_from_the_environment_and_no_volume_is_shared(compose_api: dict[str, Any]) -> None:
    assert compose_api["environment"]["SHARDFUSE_API__KEYS"] == "${API_KEYS:-[]}"
    assert service_settings(compose_api).api.keys == ()  # the default: no key, every request refused (401)
    assert all(source in ("", "./config/compose.toml") for source, _, _ in volume_mounts(compose_api))


@overlays
def test_k8s_api_is_probed_served_and_selected(overlay: str) -> None:
    items = k8s.objects(overlay)
    api = k8s.named(items, "Deployment", "api")
    (container,) = k8s.containers(k8s.pod_spec(api))
    port = _listen_port(container["args"])
    http = next(p for p in container["ports"] if p["containerPort"] == port)
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": http["name"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": http["name"]}
    service = k8s.named(items, "Service", "api")
    assert k8s.selects(service["spec"]["selector"], k8s.pod_labels(api))
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [http["name"]]
    assert api["spec"]["replicas"] >= 2  # stateless: more than one, so a rollout or a node drain keeps it up


@overlays
def test_k8s_api_keys_are_hashes_from_the_secret(overlay: str) -> None:
    items = k8s.objects(overlay)
    (container,) = k8s.containers(k8s.pod_spec(k8s.named(items, "Deployment", "api")))
    (keys,) = [v for v in container["env"] if v["name"] == "SHARDFUSE_API__KEYS"]
    assert keys["valueFrom"]["secretKeyRef"] == {"name": "shardfuse-secrets", "key": "api-keys", "optional": True}
    settings = k8s.container_settings(container)
    assert [entry.name for entry in settings.api.keys] == ["placeholder"]  # the Secret's JSON, parsed


@overlays
def test_k8s_api_reads_the_same_shards_as_the_query_pool(overlay: str) -> None:
    """``GET /v1/status`` counts every shard's documents: the API must know the shards the workers use."""
    items = k8s.objects(overlay)
    (api,) = k8s.containers(k8s.pod_spec(k8s.named(items, "Deployment", "api")))
    (query,) = k8s.containers(k8s.pod_spec(k8s.named(items, "Deployment", "worker-query")))
    api_settings, query_settings = k8s.container_settings(api), k8s.container_settings(query)
    assert api_settings.shards == query_settings.shards
    assert api_settings.postgres.shard_dsns == query_settings.postgres.shard_dsns
    assert api_settings.cas.url == query_settings.cas.url  # uploads land where ingest reads
