"""Flower as a user sees it: the session's embedded stack, Flower's dashboard opened in headless Chromium
(Debian's ``chromium``, driven by Playwright), logged in with the basic-auth credentials, listing one online
worker per pool. ``SHARDFUSE_SCREENSHOT=docs/images/flower.png`` keeps the screenshot (the README's)."""

from __future__ import annotations

import shutil
import socket
import time
import uuid
from pathlib import Path

import pytest
from playwright import sync_api

from shardfuse.workers.names import Queue
from tests.integration.conftest import Stack
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, keep_screenshot

pytestmark = pytest.mark.integration


def test_flower_lists_an_online_worker_for_every_pool_after_logging_in(stack: Stack, tmp_path: Path) -> None:
    assert shutil.which(CHROMIUM), "Debian's chromium is installed by `make install` (Makefile)"
    url = stack.state.flower_url
    user, password = stack.settings.flower.user, stack.settings.flower.password.get_secret_value()
    expected = {f"{queue.value}@{socket.gethostname()}" for queue in Queue}
    # A few tasks, so the dashboard's counters are not all zero.
    zone = f"flower-{uuid.uuid4().hex[:8]}"
    with stack.publisher() as publisher:
        for i in range(3):
            publisher.write(zone=zone, path=f"f{i}.txt", data=f"flower dashboard document {i}".encode())
    stack.wait()
    stack.search("flower dashboard", zone, k=3)

    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            # Without credentials, or with a wrong password, Flower refuses the page.
            anonymous = browser.new_context()
            assert anonymous.request.get(url).status == 401
            wrong = browser.new_context(http_credentials={"username": user, "password": password + "x"})
            assert wrong.request.get(url).status == 401

            context = browser.new_context(http_credentials={"username": user, "password": password},
                                          viewport={"width": 1280, "height": 720})
            page = context.new_page()
            response = page.goto(url)
            assert response is not None and response.status == 200
            # Flower fills the table from the workers' events and heartbeats: reload until all are listed.
            deadline = time.monotonic() + 60
            online: set[str] = set()
            while True:
                page.wait_for_selector("table tbody tr td", timeout=15_000)
                # textContent, not innerText: the rendered text of a narrow cell may wrap mid-name.
                rows = [[cell.strip() for cell in row.locator("td").all_text_contents()]
                        for row in page.locator("table tbody tr").all()]
                online = {row[0] for row in rows if len(row) > 1 and row[1] == "Online"} & expected
                if online == expected or time.monotonic() > deadline:
                    break
                time.sleep(1)
                page.reload()
            assert online == expected, f"the dashboard lists {rows}"
            shot = tmp_path / "flower.png"
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    keep_screenshot(shot, min_bytes=10_000)
