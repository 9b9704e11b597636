"""Checks shared by the deployment tests (docker-compose.yml, the Dockerfile, k8s/ manifests).

A deployment file is only right if what it hands shardfuse would be accepted at run time: the command a
container runs must parse with the real CLI parser, every ``SHARDFUSE_*`` variable must name a settings
field (``Settings`` forbids unknown keys, but an unknown *environment variable* is silently ignored, so a
typo would quietly leave a default in place), and a mounted settings file must load. These helpers check
exactly that, without a container engine; each raises ``AssertionError`` with a message naming the culprit.
"""

from __future__ import annotations

import contextlib
import io
import os
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from unittest import mock

from pydantic import BaseModel

from shardfuse.pipeline.config.settings import CONFIG_ENV, Settings, TaskLimits, WorkerSettings, load_settings
from shardfuse.workers.cli.main import build_parser
from shardfuse.workers.names import QUEUE_POOLS, Queue

__all__ = ["ENV_PREFIX", "POOLS", "QUEUES", "check_config_file", "check_env", "cli_check", "hard_limit_s",
           "is_interpolated", "unknown_env"]  # fmt: skip

ENV_PREFIX = "SHARDFUSE_"
QUEUES: tuple[Queue, ...] = tuple(Queue)
# Queue -> Celery pool type ("prefork" | "threads").
POOLS: dict[Queue, str] = dict(QUEUE_POOLS)

_LIMITS: dict[Queue, Callable[[WorkerSettings], TaskLimits]] = {
    Queue.INGEST: lambda w: w.ingest_limits,
    Queue.EMBED: lambda w: w.embed_limits,
    Queue.MAINTENANCE: lambda w: w.maintenance_limits,
    Queue.QUERY: lambda w: w.query_limits,
}


def hard_limit_s(queue: Queue | str, settings: Settings) -> int:
    """The hard time limit (seconds) of the tasks a queue's workers run: a worker asked to stop may need
    this long to finish its current task, so a container's stop grace period must exceed it."""
    return _LIMITS[Queue(queue)](settings.workers).hard_s


def cli_check(argv: list[str]) -> None:
    """Assert that ``shardfuse <argv>`` parses (``argv`` without the program name).

    ``--help`` (argparse exits 0) counts as accepted. Only parsing is checked: nothing runs.
    """
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(list(argv))
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise AssertionError(f"shardfuse rejects {argv!r}: {stderr.getvalue().strip()}") from None


def is_interpolated(value: str) -> bool:
    """True if a deployment tool fills the value in (``${VAR}`` in compose, ``$(VAR)`` in Kubernetes)."""
    return "${" in value or "$(" in value


def unknown_env(names: typing.Iterable[str]) -> list[str]:
    """The ``SHARDFUSE_*`` names among ``names`` that name no settings field (``SHARDFUSE_CONFIG`` is known)."""
    return sorted(name for name in names if name.upper().startswith(ENV_PREFIX) and not _names_field(name))


def check_env(env: Mapping[str, str], *, config_file: str | os.PathLike[str] | None = None) -> None:
    """Assert that every ``SHARDFUSE_*`` variable of ``env`` would take effect.

    Names: ``SHARDFUSE_A__B`` must walk ``Settings.a.b`` (case-insensitive, through nested sections and the
    values of dict fields such as ``embedders.<name>``); ``SHARDFUSE_CONFIG`` is allowed. Values: the
    literal ones (no ``${``/``$(``) are validated by building ``Settings`` from them alone, on top of
    ``config_file`` if given (the file the deployment mounts at ``SHARDFUSE_CONFIG``), so that cross-field
    rules (lease longer than the hard limits …) are checked against what the container really gets. Other
    variables of this process's environment take no part. Variables not starting with ``SHARDFUSE_`` are
    ignored.
    """
    unknown = unknown_env(env)
    if unknown:
        raise AssertionError(f"unknown settings variables (no such field of Settings): {unknown}")
    literal = {
        name: value for name, value in env.items()
        if name.upper().startswith(ENV_PREFIX) and name.upper() != CONFIG_ENV and not is_interpolated(value)
    }  # fmt: skip
    with _settings_environment(literal, config_file):
        try:
            Settings()
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise AssertionError(f"settings variables {sorted(literal)} are rejected: {exc}") from None


def check_config_file(path: str | os.PathLike[str]) -> Settings:
    """Load a settings file the way a container does (``load_settings`` rejects unknown keys and bad values);
    this process's own ``SHARDFUSE_*`` variables take no part. Returns the settings."""
    with _settings_environment({}, None):
        return load_settings(path)


# -- internals -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _settings_environment(
    variables: Mapping[str, str], config_file: str | os.PathLike[str] | None
) -> typing.Iterator[None]:
    """``os.environ`` with none of its own ``SHARDFUSE_*`` variables, plus ``variables`` (restored after)."""
    with mock.patch.dict(os.environ):
        for name in [name for name in os.environ if name.upper().startswith(ENV_PREFIX)]:
            del os.environ[name]
        os.environ.update(variables)
        if config_file is not None:
            os.environ[CONFIG_ENV] = str(Path(config_file).resolve())
        yield


def _names_field(name: str) -> bool:
    path = name[len(ENV_PREFIX):].lower()
    if path == CONFIG_ENV[len(ENV_PREFIX):].lower():
        return True
    return _walk(Settings, path.split("__"))


def _walk(annotation: object, parts: list[str]) -> bool:
    """True if ``parts`` is a path into a value of type ``annotation``."""
    if not parts:
        return True  # a whole section or dict given as JSON is accepted by pydantic-settings
    head, rest = parts[0], parts[1:]
    for candidate in _candidates(annotation):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            fields = {field_name.lower(): field for field_name, field in candidate.model_fields.items()}
            if head in fields and _walk(fields[head].annotation, rest):
                return True
        elif typing.get_origin(candidate) in (dict, Mapping) and head:
            args = typing.get_args(candidate)
            if _walk(args[1] if len(args) == 2 else object, rest):  # any key, then the value's type
                return True
    return False


def _candidates(annotation: object) -> list[object]:
    """The members of a union (``X | None``), or the annotation itself."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return list(typing.get_args(annotation))
    return [annotation]
