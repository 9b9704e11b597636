"""The workers' Celery app (workers/celery_app.py) is built when a process starts, from the settings its
launcher handed it, or from file and environment for ``celery -A`` run by hand. Each case runs in a fresh
interpreter, as a worker would: the app is built once per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shardfuse.pipeline.config.handoff import RESOLVED_SETTINGS_ENV, write_settings_file
from shardfuse.pipeline.config.settings import load_settings
from tests.support.paths import REPO

# What a worker built from its settings shows: its shard count, its broker and a value Celery took from them.
REPORT = """
import json, sys
import shardfuse.workers.celery_app as module
built_at_import = "app" in vars(module) or module.worker_app.cache_info().currsize > 0
from celery.app.utils import find_app
app = find_app("shardfuse.workers.celery_app:app")  # what `celery -A ... worker|flower` does
from shardfuse.workers.celery_app import app as imported  # what a task module does
json.dump({"built_at_import": built_at_import, "same": app is imported, "shards": app.shardfuse_settings.shards,
           "broker": app.conf.broker_url,
           "visibility": app.conf.broker_transport_options["visibility_timeout"]}, sys.stdout)
"""


def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {name: value for name, value in os.environ.items() if not name.startswith("SHARDFUSE_")}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, cwd=REPO, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def report(**env: str) -> dict[str, object]:
    proc = run(REPORT, **env)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def test_the_app_is_built_from_the_settings_file_its_launcher_named(tmp_path: Path) -> None:
    settings = load_settings(shards=3, broker={"url": "redis://127.0.0.1:6391/0", "visibility_timeout_s": 4321})
    path = write_settings_file(settings, tmp_path / "settings.json")
    # The child's own variables and config file do not count: the launcher resolved those already.
    config = tmp_path / "other.toml"
    config.write_text("shards = 6\n")
    shown = report(**{RESOLVED_SETTINGS_ENV: str(path), "SHARDFUSE_SHARDS": "5", "SHARDFUSE_CONFIG": str(config)})
    assert shown == {"built_at_import": False, "same": True, "shards": 3, "broker": "redis://127.0.0.1:6391/0",
                     "visibility": 4321}


def test_without_a_launcher_the_app_takes_file_and_environment(tmp_path: Path) -> None:
    config = tmp_path / "site.toml"
    config.write_text("shards = 6\n[broker]\nvisibility_timeout_s = 5000\n")
    shown = report(SHARDFUSE_CONFIG=str(config), SHARDFUSE_SHARDS="5")
    assert (shown["shards"], shown["visibility"], shown["built_at_import"]) == (5, 5000, False)


@pytest.mark.parametrize("problem", ["missing", "invalid"])
def test_importing_the_module_builds_nothing_and_bad_settings_fail_when_the_app_is_needed(
    tmp_path: Path, problem: str
) -> None:
    path = tmp_path / "settings.json"
    if problem == "invalid":
        path.write_text('{"shards": 0}')
    code = ("import shardfuse.workers.celery_app as module\nprint('imported', flush=True)\n"
            "from shardfuse.workers.celery_app import app\n")
    proc = run(code, **{RESOLVED_SETTINGS_ENV: str(path)})
    assert proc.stdout == "imported\n"
    assert proc.returncode != 0 and "ConfigurationError" in proc.stderr and str(path) in proc.stderr
