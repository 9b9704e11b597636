"""docker-compose.yml, config/compose.toml and .env.example, checked without a container engine.

The file must follow the Compose Specification (its JSON schema, as check-jsonschema bundles it), and what it
hands shardfuse must be accepted at run time: commands parse with the real CLI parser, every ``SHARDFUSE_*``
variable names a settings field, the mounted settings file loads, each worker pool has one service that
stops no sooner than its tasks' hard limit, and no password is written in the file. The object store and
the data dirs (nothing shared but the stores): test_deploy_compose_storage.py.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers.names import Queue
from tests.support import redis_memory
from tests.support.compose_file import (
    COMPOSE,
    COMPOSE_TOML,
    CONFIG_TARGET,
    DATA_DIR,
    ENV_EXAMPLE,
    INTERPOLATION,
    is_named_volume,
    load,
    shardfuse_services,
    strings,
    volume_mounts,
    worker_services,
)
from tests.support.deployment import QUEUES, check_config_file, check_env, cli_check, hard_limit_s
from tests.support.paths import REPO

SECRET_WORDS = re.compile(r"PASSWORD|SECRET|API_KEY|TOKEN", re.IGNORECASE)
# The stores every worker waits for (healthy) before it starts.
STORES = {"redis", "postgres", "seaweedfs"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load(COMPOSE)


@pytest.fixture(scope="module")
def compose_settings() -> Settings:
    return check_config_file(COMPOSE_TOML)


def seconds(duration: str) -> float:
    """A Compose (Go) duration: ``90s``, ``1m30s``, ``1h``."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a duration: {duration!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


def mappings(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from mappings(value)
    elif isinstance(node, list):
        for value in node:
            yield from mappings(value)


# -- the specification ------------------------------------------------------------------------------------


def test_compose_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    schema_file = resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json")
    schema = json.loads(schema_file.read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    errors = [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(compose)]
    assert errors == []
    assert "version" not in compose  # obsolete in the Compose Specification


# -- what shardfuse receives ------------------------------------------------------------------------------


def test_every_shardfuse_command_parses(compose: dict[str, Any]) -> None:
    services = shardfuse_services(compose)
    assert set(worker_services(compose)) <= set(services)
    for name, service in services.items():
        entrypoint = service.get("entrypoint", ["shardfuse"])  # the image's ENTRYPOINT
        assert entrypoint == ["shardfuse"], name
        cli_check(service["command"])
        test = service.get("healthcheck", {}).get("test", [])
        if test[:2] == ["CMD", "shardfuse"]:
            cli_check(test[2:])


def test_every_settings_variable_names_a_settings_field(compose: dict[str, Any]) -> None:
    services = shardfuse_services(compose)
    assert services
    for name, service in services.items():
        environment = service["environment"]
        assert isinstance(environment, dict), f"{name}: environment as a mapping, please"
        assert environment.get("SHARDFUSE_CONFIG") == CONFIG_TARGET, name
        check_env(environment, config_file=COMPOSE_TOML)


def test_settings_file_is_mounted_where_shardfuse_config_points(compose: dict[str, Any]) -> None:
    for name, service in shardfuse_services(compose).items():
        mounts = {target: (source, read_only) for source, target, read_only in volume_mounts(service)}
        assert mounts.get(CONFIG_TARGET) == ("./config/compose.toml", True), name


def test_compose_settings_file_loads_and_holds_no_secret(compose_settings: Settings) -> None:
    assert compose_settings.embedder.dimensions > 0  # loaded: unknown keys and bad values would have raised
    secret_keys = {"url", "result_backend", "dsn", "shard_dsns", "password", "api_key"}

    def keys(table: dict[str, Any], prefix: str = "") -> Iterator[str]:
        for key, value in table.items():
            yield f"{prefix}{key}"
            if isinstance(value, dict):
                yield from keys(value, f"{prefix}{key}.")

    found = [key for key in keys(tomllib.loads(COMPOSE_TOML.read_text())) if key.rsplit(".", 1)[-1] in secret_keys]
    assert found == [], "secrets (and the URLs and DSNs that hold them) come from the environment"


def test_secret_settings_come_from_the_environment(compose: dict[str, Any]) -> None:
    """What config/compose.toml leaves out must be set for every shardfuse container."""
    required = {"SHARDFUSE_BROKER__URL", "SHARDFUSE_BROKER__RESULT_BACKEND", "SHARDFUSE_POSTGRES__DSN"}
    for name, service in shardfuse_services(compose).items():
        assert required <= set(service["environment"]), name
    assert "SHARDFUSE_FLOWER__PASSWORD" in compose["services"]["flower"]["environment"]


# -- worker pools -----------------------------------------------------------------------------------------


def test_every_queue_has_exactly_one_worker_service(compose: dict[str, Any]) -> None:
    served = [service["command"][1] for service in worker_services(compose).values()]
    assert sorted(served) == sorted(queue.value for queue in QUEUES)


@pytest.mark.parametrize("queue", QUEUES)
def test_worker_service_outlasts_its_tasks_hard_limit_when_stopped(
    compose: dict[str, Any], compose_settings: Settings, queue: Queue
) -> None:
    (service,) = [s for s in worker_services(compose).values() if s["command"][1] == queue.value]
    assert seconds(service["stop_grace_period"]) > hard_limit_s(queue, compose_settings)


@pytest.mark.parametrize("queue", QUEUES)
def test_worker_concurrency_is_the_pools_settings_variable(compose: dict[str, Any], queue: Queue) -> None:
    (service,) = [s for s in worker_services(compose).values() if s["command"][1] == queue.value]
    assert f"SHARDFUSE_WORKERS__{queue.value.upper()}_CONCURRENCY" in service["environment"]


def test_workers_wait_for_healthy_stores(compose: dict[str, Any]) -> None:
    for name, service in worker_services(compose).items():
        depends = service["depends_on"]
        assert {key: value["condition"] for key, value in depends.items()} == dict.fromkeys(
            STORES, "service_healthy"), name  # fmt: skip


def test_workers_can_be_scaled(compose: dict[str, Any]) -> None:
    """``docker compose up --scale embed=4``: a fixed container name or a published port would collide."""
    for name, service in worker_services(compose).items():
        assert "container_name" not in service, name
        assert "ports" not in service, name


def test_one_image_built_from_this_repository(compose: dict[str, Any]) -> None:
    services = shardfuse_services(compose)
    assert set(services) >= {"ingest", "embed", "maintenance", "query", "flower", "cli"}
    for name, service in services.items():
        assert service["build"]["context"] == ".", name


# -- health checks ----------------------------------------------------------------------------------------


def test_every_long_running_service_has_a_health_check(compose: dict[str, Any]) -> None:
    expected = {*STORES, "flower", *worker_services(compose)}
    assert {name for name, service in compose["services"].items() if service.get("healthcheck", {}).get("test")} \
        >= expected


def test_worker_health_check_pings_its_own_pool(compose: dict[str, Any]) -> None:
    for name, service in worker_services(compose).items():
        test = service["healthcheck"]["test"]
        assert test[:4] == ["CMD", "shardfuse", "ping", service["command"][1]], name
        timeout = float(test[test.index("--timeout") + 1])
        assert seconds(service["healthcheck"]["timeout"]) > timeout, f"{name}: the probe outlives its ping"


def test_redis_is_durable_password_protected_and_checked(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    assert redis["image"].split(":")[0] == "redis"
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command and "--requirepass" in command
    assert "redis-cli" in " ".join(redis["healthcheck"]["test"]) and "ping" in " ".join(redis["healthcheck"]["test"])
    assert any(target == "/data" and is_named_volume(source) for source, target, _ in volume_mounts(redis))


def test_redis_refuses_writes_below_its_memory_limit_and_caches_fit_in_it(
    compose: dict[str, Any], compose_settings: Settings
) -> None:
    """At maxmemory Redis refuses writes (noeviction: no queued message is evicted) before the container's
    limit is reached (the OOM killer would lose acknowledged writes), and the caches at their bounds take
    only a share of it (docs/operations.md, "Memory budget")."""
    redis = compose["services"]["redis"]
    options = redis_memory.redis_options(" ".join(redis["command"]).split())
    assert options["maxmemory-policy"] == "noeviction"
    maxmemory = redis_memory.redis_bytes(options["maxmemory"])
    assert maxmemory <= redis_memory.MAXMEMORY_SHARE * redis_memory.docker_bytes(redis["mem_limit"])
    assert redis_memory.cache_bound_bytes(compose_settings) <= redis_memory.CACHE_SHARE * maxmemory


def test_postgres_has_pgvector_a_volume_a_check_and_the_extension(compose: dict[str, Any]) -> None:
    postgres = compose["services"]["postgres"]
    assert postgres["image"].startswith("pgvector/pgvector:")
    # A pinned pgvector 0.8+ (iterative index scans, halfvec) on PostgreSQL 16, as in the embedded stack.
    release = re.fullmatch(r"pgvector/pgvector:(\d+)\.(\d+)\.(\d+)-pg16", postgres["image"])
    assert release and tuple(map(int, release.groups())) >= (0, 8, 0), postgres["image"]
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    mounts = volume_mounts(postgres)
    assert any(target == "/var/lib/postgresql/data" and is_named_volume(source) for source, target, _ in mounts)
    init = [REPO / source for source, target, _ in mounts if target.startswith("/docker-entrypoint-initdb.d/")]
    assert init and all(path.is_file() for path in init)
    assert any("create extension if not exists vector" in path.read_text().lower() for path in init)
    # The DSN every shardfuse container gets names the user and database the image creates.
    environment = postgres["environment"]
    dsn = compose["services"]["ingest"]["environment"]["SHARDFUSE_POSTGRES__DSN"]
    assert dsn.startswith(f"postgresql://{environment['POSTGRES_USER']}:")
    assert dsn.endswith(f"@postgres:5432/{environment['POSTGRES_DB']}")


# -- Flower -----------------------------------------------------------------------------------------------


def test_flower_is_authenticated_persistent_and_published(compose: dict[str, Any]) -> None:
    flower = compose["services"]["flower"]
    command = flower["command"]
    assert command[0] == "flower"
    port = command[command.index("--port") + 1] if "--port" in command else "5555"
    assert any(str(entry).endswith(f":{port}") for entry in flower["ports"])
    assert "FLOWER_PASSWORD" in flower["environment"]["SHARDFUSE_FLOWER__PASSWORD"]
    # Its persistent db lives under its data dir (or --db): that folder must be a named volume.
    db_folder = str(Path(command[command.index("--db") + 1]).parent) if "--db" in command else DATA_DIR
    on_volume = [source for source, target, _ in volume_mounts(flower)
                 if is_named_volume(source) and (db_folder + "/").startswith(target.rstrip("/") + "/")]  # fmt: skip
    assert on_volume, "Flower's history would not survive a restart"
    assert f":{port}/healthcheck" in " ".join(flower["healthcheck"]["test"])


# -- volumes and the cli -----------------------------------------------------------------------------------


def test_named_volumes_are_declared_and_bind_mounts_exist(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        for source, _, _ in volume_mounts(service):
            if is_named_volume(source):
                assert source in declared, f"{name}: volume {source!r} is not declared"
            elif source and not source.startswith("$"):  # "" is an anonymous volume
                assert (REPO / source).exists(), f"{name}: {source} does not exist"


def test_cli_service_is_a_profile_running_shardfuse_on_read_only_sources(compose: dict[str, Any]) -> None:
    cli = compose["services"]["cli"]
    assert cli["profiles"] == ["cli"]  # `docker compose up` does not start it
    assert cli["entrypoint"] == ["shardfuse"]
    mounts = {target: (source, read_only) for source, target, read_only in volume_mounts(cli)}
    assert cli["working_dir"] in mounts and mounts[cli["working_dir"]][1] is True
    for documented in (["publish", "docs/", "--zone", "docs"], ["search", "how are chunks replaced", "--zone", "docs"],
                       ["wait"], ["status"]):  # fmt: skip
        cli_check(documented)


# -- secrets --------------------------------------------------------------------------------------------------


def test_no_password_is_written_in_the_file(compose: dict[str, Any]) -> None:
    for node in mappings(compose):
        for key, value in node.items():
            if SECRET_WORDS.search(str(key)) and isinstance(value, str):
                assert INTERPOLATION.fullmatch(value), f"{key} = {value!r} is not taken from the environment"
    for path, text in strings(compose):
        for password in re.findall(r"://[^/@\s:]*:([^@\s]+)@", text):
            assert password.startswith(("${", "$$")), f"{path}: a URL holds a literal password"
        for password in re.findall(r"--requirepass\s+(\S+)", text):
            assert "$" in password, f"{path}: a literal Redis password"


def test_a_missing_password_stops_compose_with_an_error(compose: dict[str, Any]) -> None:
    """``${NAME:?message}``: an unset or empty password is an error, not an empty password."""
    for path, text in strings(compose):
        for match in INTERPOLATION.finditer(text):
            # Optional: EMBEDDER_API_KEY (the local model needs none), API_KEYS (hashes, not secrets; none: 401).
            if SECRET_WORDS.search(match["name"]) and match["name"] not in {"EMBEDDER_API_KEY", "API_KEYS"}:
                assert match["op"] == ":?" and match["arg"], f"{path}: ${{{match['name']}}} may be empty"


def test_env_example_names_every_variable_the_file_uses(compose: dict[str, Any]) -> None:
    documented = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", ENV_EXAMPLE.read_text(), re.MULTILINE))
    used = {match["name"] for _, text in strings(compose) for match in INTERPOLATION.finditer(text)}
    assert used - documented == set()
    required = {match["name"] for _, text in strings(compose) for match in INTERPOLATION.finditer(text)
                if match["op"] == ":?"}  # fmt: skip
    uncommented = set(re.findall(r"^([A-Z][A-Z0-9_]*)=", ENV_EXAMPLE.read_text(), re.MULTILINE))
    assert required <= uncommented
