"""The PostgreSQL socket folder's checks (workers/stack/access.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shardfuse.workers.stack import access
from shardfuse.workers.stack.errors import StackError


def test_the_socket_folder_is_made_before_the_server_user_exists(tmp_path: Path) -> None:
    # Under root the server's system user is created at PostgreSQL's first start, after this check: a
    # fresh machine's first `shardfuse up` must not fail on the user it has not made yet.
    folder = tmp_path / "socket"
    access.private_socket_dir(folder, server_user="shardfuse-no-such-user")
    assert folder.is_dir()
    assert folder.stat().st_mode & 0o777 == 0o700


def test_a_socket_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can give a folder to another user")
    folder = tmp_path / "socket"
    folder.mkdir()
    os.chown(folder, 65534, -1)  # nobody
    with pytest.raises(StackError, match="not a folder of this user's"):
        access.private_socket_dir(folder, server_user="shardfuse-no-such-user")
