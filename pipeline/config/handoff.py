"""Handing resolved settings to the processes a launcher starts.

``shardfuse up``, ``shardfuse worker`` and ``shardfuse flower`` resolve the settings once (file, environment,
command-line options, keyword overrides) and start Celery processes that must run with exactly those
settings. The launcher writes them to a JSON file readable by its own user only (mode 0600: the file holds
the secrets too) and names it in the child's environment as ``SHARDFUSE_RESOLVED_SETTINGS``; the child
builds its settings from that file alone (:func:`process_settings`), whatever else its environment holds.
A process started without the variable (``celery -A shardfuse.workers.celery_app:app`` run by hand)
resolves its own from file and environment, as :func:`~shardfuse.pipeline.config.settings.load_settings`
does.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any

from pydantic import SecretStr, ValidationError

from shardfuse.pipeline.config.settings import Settings, load_settings, settings_from_json
from shardfuse.pipeline.core.errors import ConfigurationError

RESOLVED_SETTINGS_ENV = "SHARDFUSE_RESOLVED_SETTINGS"


def settings_json(settings: Settings) -> str:
    """``settings`` as JSON, secrets in clear: what :func:`read_settings_file` turns back into an equal object."""
    return json.dumps(settings.model_dump(), default=_plain, indent=1, sort_keys=True)


def write_settings_file(settings: Settings, path: Path | None = None) -> Path:
    """Write ``settings`` (secrets included) to a file only this user can read (mode 0600); return its path.

    ``path`` is replaced atomically, so a process starting meanwhile reads the old file or the new one,
    never half of one. Without ``path``, a new file is made in the temp dir.
    """
    if path is None:
        fd, name = tempfile.mkstemp(prefix="shardfuse-settings-", suffix=".json")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:  # mkstemp made it 0600, whatever the umask
            out.write(settings_json(settings))
        if path is not None:
            os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name) if path is None else path


def read_settings_file(path: Path) -> Settings:
    """The settings a launcher wrote to ``path``: exactly those, not merged with this process's environment."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read the resolved settings {path} ({RESOLVED_SETTINGS_ENV}): "
                                 f"{exc.strerror or exc}") from exc
    try:
        return settings_from_json(text)
    except ValidationError as exc:
        # Which keys and why, never the values: the file holds the secrets.
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(file)'}: {e['msg']}"
                             for e in exc.errors(include_input=False))
        raise ConfigurationError(f"the resolved settings {path} ({RESOLVED_SETTINGS_ENV}) are invalid: "
                                 f"{problems}") from None


def process_settings(environ: Mapping[str, str]) -> Settings:
    """The settings of a process that may have been started by a launcher: the file ``environ`` names as
    ``SHARDFUSE_RESOLVED_SETTINGS`` if it names one, else :func:`load_settings` (file and environment)."""
    resolved = environ.get(RESOLVED_SETTINGS_ENV)
    return read_settings_file(Path(resolved)) if resolved else load_settings()


def _plain(value: Any) -> Any:
    """What ``json`` cannot write by itself: secrets (in clear) and paths."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, PurePath):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
