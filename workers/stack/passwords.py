"""The embedded stack's passwords (and the object store's S3 keys) as ``shardfuse up`` sees them: generated on
the first ``up`` of a data dir (:mod:`shardfuse.pipeline.config.stack_secrets` keeps them), put in the settings
the launcher starts the servers and hands its workers with, and the switch-over of a data dir that an earlier
shardfuse ran without them."""

from __future__ import annotations

import re

from shardfuse.pipeline.config.redaction import MASK
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.config.stack_secrets import (
    apply_stack_secrets,
    ensure_stack_secrets,
    load_stack_secrets,
    secrets_file,
)
from shardfuse.workers.stack import access
from shardfuse.workers.stack.addresses import StackAddresses
from shardfuse.workers.stack.errors import StackError
from shardfuse.workers.stack.launch import Progress
from shardfuse.workers.stack.layout import StackLayout

# A masked password in a recorded URL: ``scheme://user:***@`` or ``scheme://:***@``.
_MASKED = re.compile(r"(?P<head>://[^/@]*?):" + re.escape(MASK) + "@")


def stack_settings(settings: Settings, *, layout: StackLayout, addresses: StackAddresses,
                   progress: Progress, s3_port: int | None = None) -> Settings:
    """``settings`` with the data dir's passwords (and S3 keys) wherever they name the stack without one, the
    passwords generated (and said so) on the data dir's first ``up``. ``s3_port``: the embedded object store's,
    if it is to run. Call it holding the data dir's lock."""
    used_before = (layout.pgdata / "PG_VERSION").exists() or any(layout.redis_dir.iterdir())
    before = load_stack_secrets(layout.data_dir)
    found, created = ensure_stack_secrets(layout.data_dir, redis_port=addresses.redis.port,
                                          postgres_port=addresses.postgres.endpoint.port, s3_port=s3_port)
    where = secrets_file(layout.data_dir)
    if before is not None and before.object_store is None:
        progress(f"shardfuse stack: added the object store's S3 keys to {where}")
    if created and used_before:
        progress(f"shardfuse stack: {layout.data_dir} ran without passwords (set up by an earlier shardfuse); "
                 f"upgrading it: Redis and PostgreSQL now require the passwords generated in {where} "
                 "(mode 0600), which shardfuse commands on this machine read from there")
    elif created:
        progress(f"shardfuse stack: generated the Redis and PostgreSQL passwords and the S3 keys in {where} "
                 "(mode 0600)")
    return apply_stack_secrets(settings, found)


def announce_postgres_upgrade(layout: StackLayout, progress: Progress) -> bool:
    """Say so if PGDATA still lets loopback clients in without a password (its next start fixes that);
    True if it does."""
    if not access.hba_trusts(layout.pgdata):
        return False
    progress(f"postgres: {layout.pgdata} trusted every loopback client (an earlier shardfuse); switching it to "
             "scram-sha-256 passwords on TCP and peer authentication on its socket")
    return True


def refuse_open_postgres(layout: StackLayout, pid: int) -> None:
    """StackError if the PostgreSQL just adopted still runs with a ``pg_hba.conf`` that trusts clients: only
    a restart gives it the new rules."""
    if access.hba_trusts(layout.pgdata):
        raise StackError(f"postgres (pid {pid}) runs without passwords (started by an earlier shardfuse); run "
                         "`shardfuse down`, then `shardfuse up` restarts it with passwords")


def without_password_masks(address: str) -> str:
    """A recorded (masked) address as an earlier, password-less shardfuse recorded the same one."""
    return _MASKED.sub(r"\g<head>@", address).replace("://@", "://")


def refuse_running_without_passwords(layout: StackLayout, *, recorded: tuple[str, ...],
                                     fresh: tuple[str, ...]) -> None:
    """StackError with the way out if the running stack differs from ``fresh`` only by having no passwords."""
    if tuple(without_password_masks(address) for address in fresh) == recorded:
        raise StackError(
            f"the stack in {layout.data_dir} runs without passwords (started by an earlier shardfuse); run "
            f"`shardfuse down`, then `shardfuse up` restarts it with the passwords in {secrets_file(layout.data_dir)}"
        )
