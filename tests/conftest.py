"""Test-session set-up shared by unit and integration tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_TIKTOKEN = REPO.parent / "shared" / "data" / "tiktoken"
# tiktoken looks for ``$TIKTOKEN_CACHE_DIR/<sha1 of the download URL>`` before it tries the network.
TIKTOKEN_FILES = {"cl100k_base.tiktoken": "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"}


def _offline_tiktoken() -> None:
    cache = Path(os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(REPO / ".cache" / "tiktoken")))
    cache.mkdir(parents=True, exist_ok=True)
    for source_name, cache_name in TIKTOKEN_FILES.items():
        target = cache / cache_name
        source = SHARED_TIKTOKEN / source_name
        if not target.exists() and source.exists():
            shutil.copyfile(source, target)


_offline_tiktoken()
# Models ship inside pip packages here; never reach for a hub during tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def isolated_settings_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Settings as a fresh machine resolves them: no ``SHARDFUSE_*`` variable of the shell running the tests, and
    the default data dir (``~/.shardfuse``) in a home of its own, since a real one may hold a stack's passwords and
    ports, which ``load_settings`` would fill in (pipeline/config/stack_secrets.py, stack_ports.py)."""
    for key in list(os.environ):
        if key.startswith("SHARDFUSE_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
