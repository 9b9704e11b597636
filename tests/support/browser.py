"""Debian's Chromium, driven by playwright for the tests that look at a real UI (Flower, Prometheus), and the
screenshots they take (kept where ``SHARDFUSE_SCREENSHOT`` says: ``make flower-screenshot`` /
``make prometheus-screenshot``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
# This machine's network is closed: without these, Chromium keeps trying to reach Google's hosts.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def keep_screenshot(shot: Path, *, min_bytes: int) -> None:
    """Check ``shot`` is a PNG of at least ``min_bytes`` (a blank page is smaller); copy it to
    ``$SHARDFUSE_SCREENSHOT`` when that is set."""
    data = shot.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > min_bytes
    keep = os.environ.get("SHARDFUSE_SCREENSHOT")
    if keep:
        Path(keep).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, keep)
