"""The embedded stack with passwords on by default (issue 20, item 10): the first ``up`` of a data dir generates
a Redis and a PostgreSQL password (``<data_dir>/stack-secrets.json``, mode 0600), both servers require them,
and every shardfuse command finds them with no extra step. A data dir an earlier shardfuse ran without
passwords is switched over by the next ``up``, its data kept."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from shardfuse.pipeline.config.redaction import dsn_password, url_password
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.config.stack_secrets import load_stack_secrets, secrets_file, with_stack_secrets
from shardfuse.workers.stack import StackError, down, up
from shardfuse.workers.stack.access import HBA_CONF, hba_trusts
from shardfuse.workers.stack.addresses import StackAddresses
from shardfuse.workers.stack.layout import StackLayout
from shardfuse.workers.stack.state import load_state, save_state
from tests.integration.conftest import Stack
from tests.integration.ports import free_port

pytestmark = pytest.mark.integration

SERVERS = {"redis", "postgres"}
# pg_hba.conf as shardfuse wrote it before passwords: every loopback client trusted.
OLD_HBA = (
    "# Written by `shardfuse up` at every start; edits here are overwritten.\n"
    "# TYPE  DATABASE  USER  ADDRESS       METHOD\n"
    "local   all       all                 trust\n"
    "host    all       all   127.0.0.0/8   trust\n"
    "host    all       all   ::1/128       trust\n"
)
NO_PASSFILE = "/nonexistent/pgpass"  # a ~/.pgpass must not supply what the test leaves out


def _redis_refuses(endpoint_host: str, port: int, password: str | None) -> bool:
    client = redis.Redis(host=endpoint_host, port=port, password=password, socket_timeout=5,
                         retry=Retry(NoBackoff(), 0))  # fmt: skip
    try:
        client.ping()
    except redis.AuthenticationError:  # NOAUTH without a password, WRONGPASS with a wrong one
        return True
    finally:
        client.close()
    return False


def _postgres_refusal(dsn: str) -> str:
    """The server's reason for refusing ``dsn`` (AssertionError if it lets it in)."""
    try:
        psycopg.connect(dsn, connect_timeout=5, passfile=NO_PASSFILE).close()
    except psycopg.OperationalError as exc:
        return str(exc)
    raise AssertionError(f"PostgreSQL let {dsn!r} in")


def _others_may_enter(path: Path) -> bool:
    return bool(stat.S_IMODE(path.stat().st_mode) & (stat.S_IRWXO | stat.S_IRGRP | stat.S_IWGRP))


def test_the_stack_requires_its_generated_passwords(stack: Stack) -> None:
    data = stack.settings.data_path
    found = load_stack_secrets(data)
    assert found is not None and stat.S_IMODE(secrets_file(data).stat().st_mode) == 0o600
    assert not _others_may_enter(data)
    # The settings the tests resolve (as every shardfuse command does) carry them; the variables do not.
    assert url_password(stack.settings.broker.url) == found.redis_password
    assert dsn_password(stack.settings.postgres.dsn) == found.postgres_password
    assert found.redis_password not in str(stack.env) and found.postgres_password not in str(stack.env)

    addresses = StackAddresses.from_settings(stack.settings)
    for password in (None, "wrong", found.postgres_password):
        assert _redis_refuses(addresses.redis.host, addresses.redis.port, password), password
    assert not _redis_refuses(addresses.redis.host, addresses.redis.port, found.redis_password)

    port, user = addresses.postgres.endpoint.port, addresses.postgres.user
    refusals = [_postgres_refusal(dsn) for dsn in (
        f"postgresql://{user}@127.0.0.1:{port}/shardfuse",
        f"postgresql://{user}:wrong@127.0.0.1:{port}/shardfuse",
        f"postgresql://{user}@localhost:{port}/postgres",
        f"postgresql://{user}:{found.redis_password}@127.0.0.1:{port}/shardfuse",
        f"postgresql://nobody_{port}@127.0.0.1:{port}/postgres",  # a role with no password at all
    )]  # fmt: skip
    assert all("password" in reason for reason in refusals), refusals
    # The socket is the stack's own way in (peer authentication, as the superuser only), in a 0700 folder.
    socket_dir = StackLayout(data).postgres_socket_dir
    assert stat.S_IMODE(socket_dir.stat().st_mode) == 0o700
    reason = _postgres_refusal(f"host={socket_dir} port={port} user=nobody_{port} dbname=postgres")
    assert "peer" in reason.lower() or "ident" in reason.lower(), reason
    with psycopg.connect(stack.settings.postgres.dsn) as conn:
        rules = conn.execute("SELECT type, auth_method FROM pg_hba_file_rules").fetchall()
        assert ("local", "peer") in rules and all(method != "trust" for _, method in rules), rules
        assert {method for kind, method in rules if kind == "host"} == {"scram-sha-256"}
        assert conn.execute("SHOW unix_socket_permissions").fetchone() == ("0700",)
    print("refusals:", [reason.splitlines()[0][-80:] for reason in refusals], "socket:", reason.splitlines()[0])


def test_shardfuse_commands_find_the_passwords_by_themselves(stack: Stack, tmp_path: Path) -> None:
    """``publish``, ``wait``, ``search``, ``status`` and ``up`` as a user runs them: the environment names the
    data dir and the addresses, no password; the commands read the data dir's."""
    found = load_stack_secrets(stack.settings.data_path)
    assert found is not None
    before = secrets_file(stack.settings.data_path).read_bytes()
    doc = tmp_path / "vault-notes.md"
    doc.write_text("# Vault\n\nThe stackpasswordterm opens nothing without its password.\n")
    stack.cli("publish", str(doc), "--zone", "passwords")
    stack.cli("wait", "--timeout", "120")
    for mode in ("keyword", "semantic"):
        out = stack.cli("search", "stackpasswordterm", "--zone", "passwords", "--mode", mode, "-k", "3").stdout
        assert "vault-notes.md" in out, (mode, out)
    status = stack.cli("status")
    again = stack.cli("up", "--timeout", "60")  # a second up: the same passwords, nothing restarted
    assert "nothing started" in again.stdout
    assert secrets_file(stack.settings.data_path).read_bytes() == before
    for shown in (status.stdout, status.stderr, again.stdout, again.stderr):
        assert found.redis_password not in shown and found.postgres_password not in shown
    assert "redis://:***@" in status.stdout


@pytest.fixture
def old_data_dir() -> Iterator[Settings]:
    """Settings of a private Redis + PostgreSQL in a new data dir (outside pytest's tmp root: under root the
    server's own user must pass through every parent); whatever a failing test left running is stopped."""
    parent = Path(tempfile.mkdtemp(prefix="shardfuse-passwords-test-"))
    os.chmod(parent, 0o755)
    redis_port, pg_port = free_port(), free_port()
    settings = Settings(
        data_dir=parent / "data",
        broker={"url": f"redis://127.0.0.1:{redis_port}/0", "result_backend": f"redis://127.0.0.1:{redis_port}/1"},
        postgres={"dsn": f"postgresql://postgres@127.0.0.1:{pg_port}/sf_upgrade"},
        stack={"flower_port": free_port(), "api_port": free_port()},
    )
    yield settings
    down(settings, timeout=10)
    shutil.rmtree(parent, ignore_errors=True)


def _make_it_old(settings: Settings, postmaster: int) -> None:
    """Turn the running servers' data dir into one an earlier shardfuse made: loopback trusted, the role
    without a password, no passwords file, folders open to all; keep data in both servers."""
    layout = StackLayout(settings.data_path)
    live = with_stack_secrets(settings)
    client = redis.Redis.from_url(live.broker.url)
    client.set("legacy-key", "kept")
    client.close()
    (layout.pgdata / HBA_CONF).write_text(OLD_HBA)
    os.kill(postmaster, signal.SIGHUP)  # reloads pg_hba.conf
    for _ in range(100):
        try:
            with psycopg.connect(settings.postgres.dsn, autocommit=True, passfile=NO_PASSFILE) as conn:
                conn.execute("ALTER ROLE postgres PASSWORD NULL")
                conn.execute("CREATE TABLE legacy (note text)")
                conn.execute("INSERT INTO legacy VALUES ('kept')")
            break
        except psycopg.OperationalError:
            time.sleep(0.1)
    else:
        raise AssertionError("the server never took the old pg_hba.conf")
    assert down(settings, timeout=20)
    secrets_file(settings.data_path).unlink()
    for folder in (layout.data_dir, layout.postgres_socket_dir):
        os.chmod(folder, 0o755)


def test_a_data_dir_from_before_passwords_is_upgraded_in_place(old_data_dir: Settings) -> None:
    settings, layout = old_data_dir, StackLayout(old_data_dir.data_path)
    first = up(settings, only=SERVERS, progress=lambda _: None, timeout=60)
    _make_it_old(settings, first.components["postgres"].pid)
    assert hba_trusts(layout.pgdata) and load_stack_secrets(layout.data_dir) is None

    lines: list[str] = []
    up(settings, only=SERVERS, progress=lines.append, timeout=60)
    print("\n".join(lines))
    assert any("ran without passwords" in line and "upgrading it" in line for line in lines), lines
    assert any(line.startswith("postgres:") and "scram-sha-256" in line for line in lines), lines
    found = load_stack_secrets(layout.data_dir)
    assert found is not None and stat.S_IMODE(secrets_file(layout.data_dir).stat().st_mode) == 0o600
    assert not hba_trusts(layout.pgdata) and not _others_may_enter(layout.data_dir)
    assert stat.S_IMODE(layout.postgres_socket_dir.stat().st_mode) == 0o700

    # Without the password nobody gets in any more; with it, everything from before is there.
    assert "password" in _postgres_refusal(settings.postgres.dsn)
    addresses = StackAddresses.from_settings(settings)
    assert _redis_refuses(addresses.redis.host, addresses.redis.port, None)
    live = with_stack_secrets(settings)
    with psycopg.connect(live.postgres.dsn) as conn:
        assert conn.execute("SELECT note FROM legacy").fetchall() == [("kept",)]
    client = redis.Redis.from_url(live.broker.url)
    assert client.get("legacy-key") == b"kept"
    client.close()

    # The same passwords on every later up.
    before = secrets_file(layout.data_dir).read_bytes()
    again: list[str] = []
    up(settings, only=SERVERS, progress=again.append, timeout=30)
    assert any("nothing started" in line for line in again) and not any("password" in line for line in again)
    assert secrets_file(layout.data_dir).read_bytes() == before

    # A stack an earlier shardfuse started and left running cannot get passwords without a restart: up says so.
    recorded = load_state(layout.state_file)
    assert recorded is not None
    save_state(layout.state_file, dataclasses.replace(
        recorded, broker_url=settings.broker.url, postgres_dsn=settings.postgres.dsn))  # as it recorded them
    with pytest.raises(StackError, match=r"runs without passwords.*shardfuse down"):
        up(settings, only=SERVERS, progress=lambda _: None, timeout=30)
    save_state(layout.state_file, recorded)
