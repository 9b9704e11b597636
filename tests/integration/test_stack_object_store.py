"""``shardfuse up`` with the CAS in its own object store: a stack whose ``cas.url`` is ``s3://…`` on a loopback
endpoint starts SeaweedFS (``weed``) under ``<data_dir>/objects`` with keys it generated, creates the bucket,
hands the workers the keys, and ``shardfuse down`` stops it with the rest.

A file published through the CLI (which finds the keys in the data dir's secrets file, like the passwords) is
stored in the bucket, not in a local folder, and is searchable; ``up`` again starts nothing; a killed object
store is restarted by ``up`` and still holds what it stored. Runs its own stack on free ports (bounded:
``up`` has 180 s, every wait below its own timeout).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from shardfuse.pipeline.config.stack_secrets import load_stack_secrets
from shardfuse.pipeline.storage.opening import open_s3_store
from shardfuse.workers.stack import processes, up
from shardfuse.workers.stack.layout import StackLayout
from shardfuse.workers.stack.object_store import PORTS_USED
from tests.integration.conftest import Stack, running_stack
from tests.integration.ports import free_port_run

pytestmark = pytest.mark.integration

OBJECT_STORE = "object-store"
ZONE = "objects"
TEXT = "The quarterly zephyrine report lives in the object store, nowhere on a shared disk.\n"


@pytest.fixture(scope="module")
def s3_stack() -> Iterator[tuple[Stack, int]]:
    """A whole stack whose CAS is ``s3://shardfuse-cas/docs`` on its own object store; the weed pid it ran
    (checked gone after ``down``, which ``running_stack`` calls)."""
    overrides = {
        "SHARDFUSE_EMBEDDER__PROVIDER": "hashing",
        "SHARDFUSE_BM25__REBUILD_DEBOUNCE_S": "0.2",
        "SHARDFUSE_CAS__URL": "s3://shardfuse-cas/docs",
        "SHARDFUSE_CAS__S3__ENDPOINT_URL": f"http://127.0.0.1:{free_port_run(PORTS_USED)}",
    }
    pids: list[int] = []
    with running_stack(overrides) as stack:
        yield stack, stack.state.components[OBJECT_STORE].pid
        pids.append(stack.state.components[OBJECT_STORE].pid)
    assert processes.wait_gone(pids[0], timeout=10), "weed is still running after shardfuse down"
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(StackLayout(stack.settings.data_path).objects_dir)
                in " ".join(p.info["cmdline"] or [])], "a weed process on the stack's data dir survived down"


def test_up_runs_the_object_store_with_generated_keys_and_hands_them_over(s3_stack: tuple[Stack, int]) -> None:
    stack, pid = s3_stack
    layout = StackLayout(stack.settings.data_path)
    assert processes.is_same_process(pid, started_at=None, cmdline_marks=("weed", str(layout.objects_dir)))
    found = load_stack_secrets(stack.settings.data_path)
    assert found is not None and found.object_store is not None
    keys = found.object_store
    # The workers run with exactly these keys (the resolved settings ``up`` wrote for them, mode 0600) …
    handed = json.loads(layout.settings_file.read_text())["cas"]["s3"]
    assert (handed["access_key_id"], handed["secret_access_key"]) == (keys.access_key_id, keys.secret_access_key)
    assert oct(layout.settings_file.stat().st_mode & 0o777) == "0o600"
    # … and so does every shardfuse command on this machine that resolves its settings.
    assert stack.settings.cas.s3.access_key_id == keys.access_key_id
    assert keys.secret_access_key not in (layout.state_file.read_text() + repr(stack.settings))


def test_a_published_file_lands_in_the_bucket_and_is_searchable(s3_stack: tuple[Stack, int], tmp_path: Path) -> None:
    stack, _ = s3_stack
    (tmp_path / "report.md").write_text(TEXT)
    stack.cli("publish", str(tmp_path), "--zone", ZONE)
    stack.wait(timeout=120)

    store = open_s3_store(stack.settings)
    try:
        digest = "sha256:" + hashlib.sha256(TEXT.encode()).hexdigest()
        assert store.get(digest) == TEXT.encode()
    finally:
        store.close()
    assert not stack.settings.cas_root.exists(), "content went to a local folder instead of the object store"
    for mode in ("keyword", "hybrid"):
        answer = stack.search("zephyrine report", ZONE, mode=mode, k=3)
        assert answer["results"] and answer["results"][0]["path"] == str(tmp_path / "report.md"), mode


def test_up_again_starts_nothing_and_restarts_a_killed_object_store(s3_stack: tuple[Stack, int]) -> None:
    stack, pid = s3_stack
    lines: list[str] = []
    again = up(stack.settings, progress=lines.append, timeout=60)
    assert again.components[OBJECT_STORE].pid == pid
    assert any("nothing started" in line for line in lines), lines

    os.kill(pid, signal.SIGKILL)
    assert processes.wait_gone(pid, timeout=30)
    lines.clear()
    restarted = up(stack.settings, only={OBJECT_STORE}, progress=lines.append, timeout=60)
    new_pid = restarted.components[OBJECT_STORE].pid
    assert new_pid != pid and restarted.alive()[OBJECT_STORE] == new_pid
    assert any("is gone" in line for line in lines), lines
    stack.state = restarted  # what the fixture's ``down`` must stop (and check gone)
    store = open_s3_store(stack.settings)
    try:
        assert store.get("sha256:" + hashlib.sha256(TEXT.encode()).hexdigest()) == TEXT.encode()
    finally:
        store.close()
