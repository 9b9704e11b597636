"""Reading docker-compose.yml the way Docker Compose would use it, for tests/unit/deploy/test_deploy_compose*.py.

Small queries over the parsed file: which services run the shardfuse image, which run a worker pool, their
short-syntax volume mounts (named, bind or anonymous), and a service's environment with compose's
``${VAR…}`` interpolations resolved to stand-in values so that the settings it yields can be built.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple
from unittest import mock

import yaml

from shardfuse.pipeline.config.settings import CONFIG_ENV, Settings
from tests.support.paths import REPO

COMPOSE = REPO / "docker-compose.yml"
COMPOSE_TOML = REPO / "config" / "compose.toml"
ENV_EXAMPLE = REPO / ".env.example"
IMAGE = "shardfuse:latest"
CONFIG_TARGET = "/etc/shardfuse/shardfuse.toml"
DATA_DIR = "/var/lib/shardfuse"  # the image's SHARDFUSE_DATA_DIR (tests/unit/deploy/test_dockerfile.py checks it)
# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error} …
INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:?[-?+])?(?P<arg>[^}]*)\}")


def load(path: Path = COMPOSE) -> dict[str, Any]:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict), f"{path} is not a mapping"
    return document


class Mount(NamedTuple):
    """One short-syntax volume entry: ``source`` is "" for an anonymous volume (``- /path``)."""

    source: str
    target: str
    read_only: bool


def shardfuse_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run the shardfuse image."""
    return {name: service for name, service in compose["services"].items() if service.get("image") == IMAGE}


def worker_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: service for name, service in compose["services"].items()
            if (service.get("command") or [None])[0] == "worker"}  # fmt: skip


def volume_mounts(service: dict[str, Any]) -> list[Mount]:
    """The service's short-syntax volumes."""
    mounts = []
    for entry in service.get("volumes", []):
        assert isinstance(entry, str), f"long volume syntax is not checked here: {entry!r}"
        # Split on the colons outside ${...} (``${SOURCE_DIR:-.}:/src:ro``).
        parts = re.findall(r"(?:\$\{[^}]*\}|[^:$]|\$(?!\{))+", entry)
        if len(parts) == 1:  # ``- /var/lib/shardfuse``: an anonymous volume, the container's own
            mounts.append(Mount("", parts[0], read_only=False))
            continue
        source, target, *options = parts
        mounts.append(Mount(source, target, "ro" in options))
    return mounts


def is_named_volume(source: str) -> bool:
    return bool(source) and not source.startswith((".", "/", "~", "$"))


def strings(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Every string of a YAML document (keys' values and list items) with its path."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from strings(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from strings(value, f"{path}[{index}]")
    elif isinstance(node, str):
        yield path, node


def stand_in(name: str) -> str:
    """The value a test gives the ``.env`` variable ``name`` (URL-safe, as .env.example asks real ones to be)."""
    return f"{name.lower().replace('_', '-')}-value"


def interpolated(text: str) -> str:
    """``text`` as compose hands it over: ``${NAME…}`` replaced by :func:`stand_in` (or its ``:-`` default)."""

    def value(match: re.Match[str]) -> str:
        if match["op"] in (":-", "-"):
            return match["arg"]
        return stand_in(match["name"])

    return INTERPOLATION.sub(value, text)


def service_settings(service: dict[str, Any], *, config_file: Path = COMPOSE_TOML) -> Settings:
    """The settings the service's shardfuse builds: its environment (interpolated) over the mounted settings
    file; this process's own ``SHARDFUSE_*`` variables take no part."""
    environment: Mapping[str, str] = {name: interpolated(str(value))
                                      for name, value in service["environment"].items()}  # fmt: skip
    with mock.patch.dict(os.environ):
        for name in [name for name in os.environ if name.startswith("SHARDFUSE_")]:
            del os.environ[name]
        os.environ.update({name: value for name, value in environment.items() if name.startswith("SHARDFUSE_")})
        os.environ[CONFIG_ENV] = str(config_file)
        return Settings()
