"""The embedded stack's passwords and S3 keys: generated once per data dir, kept in
``<data_dir>/stack-secrets.json``.

``shardfuse up`` makes the file the first time it runs on a data dir (mode 0600, random passwords from
:mod:`secrets`) and reuses it ever after; Redis then requires its password and PostgreSQL its password over
TCP. Every process that resolves its settings with :func:`~shardfuse.pipeline.config.settings.load_settings`
(the CLI, a worker started by hand) picks the passwords up from the file with no extra step, and the workers
and Flower that ``up`` starts get them in the resolved settings it hands them.

A password is filled in only where the settings point at the stack of this data dir and give none:
``broker.url`` / ``broker.result_backend`` (``redis://``, a loopback host, the port the stack's Redis last
served) and ``postgres.dsn`` / ``postgres.shard_dsns`` (a loopback host, the port its PostgreSQL last
served). The S3 keys of the embedded object store likewise: into ``cas.s3`` where ``cas.url`` is ``s3://`` and
``cas.s3.endpoint_url`` is the loopback port that store last served, with no keys given. Keys or a password
written in the settings always win; another server on loopback is left alone.

A file written before the object store existed (no ``s3`` entry) still loads; the next ``up`` adds keys.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg.conninfo
from pydantic import SecretStr

from shardfuse.pipeline.config.cas_location import S3Location
from shardfuse.pipeline.core.errors import ConfigurationError

if TYPE_CHECKING:
    from shardfuse.pipeline.config.settings import Settings
    from shardfuse.pipeline.config.stores import CasSettings

SECRETS_FILE = "stack-secrets.json"
FORMAT_VERSION = 1
# 32 random bytes each, URL-safe base64: nothing in them needs quoting in a URL, a DSN or redis.conf.
PASSWORD_BYTES = 32
DEFAULT_REDIS_PORT = 6379
DEFAULT_POSTGRES_PORT = 5432
LOCALHOST_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
# S3 access key ids are 20 upper-case letters and digits on AWS: "SF" and 9 random bytes in upper-case hex.
ACCESS_KEY_BYTES = 9


@dataclass(frozen=True)
class ObjectStoreKeys:
    """The embedded object store's S3 keys, and the S3 port it last served (0: it never ran)."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    port: int = 0


@dataclass(frozen=True)
class StackSecrets:
    """The passwords of one data dir's Redis and PostgreSQL, and the ports those servers last listened on;
    the object store's keys (None in a file written before it existed)."""

    redis_password: str = field(repr=False)
    postgres_password: str = field(repr=False)
    redis_port: int
    postgres_port: int
    object_store: ObjectStoreKeys | None = None


def secrets_file(data_path: Path) -> Path:
    """Where the passwords of the stack in ``data_path`` are kept."""
    return data_path / SECRETS_FILE


def load_stack_secrets(data_path: Path) -> StackSecrets | None:
    """The passwords of the stack in ``data_path``; None if ``up`` never ran there or this user may not read
    them (a client of someone else's stack then fails to authenticate, which says why). ConfigurationError
    if the file is damaged."""
    path = secrets_file(data_path)
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None
    except OSError as exc:
        raise ConfigurationError(f"cannot read the stack's passwords in {path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
        return StackSecrets(
            redis_password=_text(data["redis"]["password"]), postgres_password=_text(data["postgres"]["password"]),
            redis_port=int(data["redis"]["port"]), postgres_port=int(data["postgres"]["port"]),
            object_store=_object_store_keys(data.get("s3")),
        )  # fmt: skip
    except (ValueError, TypeError, KeyError) as exc:
        # Never the content: it is the passwords.
        raise ConfigurationError(
            f"the stack's passwords in {path} are damaged ({type(exc).__name__}); run `shardfuse down`, delete the "
            "file and run `shardfuse up`: new passwords are generated and set on both servers"
        ) from None


def ensure_stack_secrets(data_path: Path, *, redis_port: int, postgres_port: int,
                         s3_port: int | None = None) -> tuple[StackSecrets, bool]:
    """The passwords and S3 keys of the stack in ``data_path``, generated (and True) if it has none yet; S3
    keys are added to a file that has none.

    The ports the stack now serves are recorded with them (``s3_port`` None: the object store does not run,
    and the port recorded before is kept). The file is (re)written atomically with mode 0600; the caller
    holds the data dir's lock (two ``up`` calls never write it at once).
    """
    current = load_stack_secrets(data_path)
    created = current is None
    if current is None:
        if secrets_file(data_path).exists():  # there, but this user may not read it: generating would orphan it
            raise ConfigurationError(f"cannot read the stack's passwords in {secrets_file(data_path)}; "
                                     "run `shardfuse up` as the user who owns the data dir")
        current = StackSecrets(redis_password=new_password(), postgres_password=new_password(),
                               redis_port=redis_port, postgres_port=postgres_port)  # fmt: skip
    keys = current.object_store or ObjectStoreKeys(access_key_id=new_access_key(), secret_access_key=new_password())
    if s3_port is not None:
        keys = replace(keys, port=s3_port)
    wanted = replace(current, redis_port=redis_port, postgres_port=postgres_port, object_store=keys)
    path = secrets_file(data_path)
    if wanted != current or created:
        _write_private(path, _to_json(wanted))
    else:
        os.chmod(path, 0o600)  # put back if someone widened it
    return wanted, created


def new_password() -> str:
    """A fresh random password (43 URL-safe characters)."""
    return secrets.token_urlsafe(PASSWORD_BYTES)


def new_access_key() -> str:
    """A fresh S3 access key id (20 upper-case letters and digits, as AWS's look)."""
    return "SF" + secrets.token_hex(ACCESS_KEY_BYTES).upper()


def with_stack_secrets(settings: Settings) -> Settings:
    """``settings`` with the passwords of its data dir's stack filled in where it points at that stack and
    gives none (unchanged if ``up`` never ran on the data dir)."""
    found = load_stack_secrets(settings.data_path)
    return settings if found is None else apply_stack_secrets(settings, found)


def apply_stack_secrets(settings: Settings, found: StackSecrets) -> Settings:
    """``settings`` with ``found``'s passwords in the URLs and DSNs that name the stack's servers without one."""
    broker = settings.broker.model_copy(update={
        "url": redis_url_with_password(settings.broker.url, found.redis_password, port=found.redis_port),
        "result_backend": redis_url_with_password(settings.broker.result_backend, found.redis_password,
                                                  port=found.redis_port),
    })  # fmt: skip
    postgres = settings.postgres.model_copy(update={
        "dsn": dsn_with_password(settings.postgres.dsn, found.postgres_password, port=found.postgres_port),
        "shard_dsns": [dsn_with_password(dsn, found.postgres_password, port=found.postgres_port)
                       for dsn in settings.postgres.shard_dsns],
    })  # fmt: skip
    cas = cas_with_keys(settings, found.object_store)
    if broker == settings.broker and postgres == settings.postgres and cas == settings.cas:
        return settings
    return settings.model_copy(update={"broker": broker, "postgres": postgres, "cas": cas})


def cas_with_keys(settings: Settings, keys: ObjectStoreKeys | None) -> CasSettings:
    """``settings.cas`` with ``keys``, if ``cas.url`` is ``s3://`` with ``cas.s3.endpoint_url`` an
    ``http://`` loopback address at the port the embedded object store last served, and no keys given; else
    ``settings.cas`` unchanged."""
    s3 = settings.cas.s3
    if keys is None or not keys.port or s3.access_key_id or s3.secret_access_key.get_secret_value():
        return settings.cas
    if not isinstance(settings.cas.location, S3Location) or embedded_s3_port(s3.endpoint_url) != keys.port:
        return settings.cas
    filled = s3.model_copy(update={"access_key_id": keys.access_key_id,
                                   "secret_access_key": SecretStr(keys.secret_access_key)})  # fmt: skip
    return settings.cas.model_copy(update={"s3": filled})


def embedded_s3_port(endpoint_url: str) -> int | None:
    """The port of ``endpoint_url`` if it is where the embedded object store would serve (``http://``, a
    loopback host, an explicit port); else None."""
    try:
        parts = urlsplit(endpoint_url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme != "http" or not parts.hostname or not is_loopback(parts.hostname):
        return None
    return port


def redis_url_with_password(url: str, password: str, *, port: int) -> str:
    """``url`` with ``password`` as the default user's, if it is ``redis://`` on loopback at ``port`` with
    no password; else ``url`` unchanged."""
    try:
        parts = urlsplit(url)
        matches = (parts.scheme == "redis" and parts.hostname is not None and is_loopback(parts.hostname)
                   and (parts.port or DEFAULT_REDIS_PORT) == port and not parts.password)  # fmt: skip
    except ValueError:  # an invalid port: the settings' own checks say so
        return url
    if not matches:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:{quote(password, safe='')}@{host}"))


def dsn_with_password(dsn: str, password: str, *, port: int) -> str:
    """``dsn`` (URL or ``key=value``) with ``password``, if it names one loopback host at ``port`` and gives
    no password; else ``dsn`` unchanged."""
    try:
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        host = str(params.get("host") or "")
        matches = (host and "," not in host and is_loopback(host) and not params.get("password")
                   and int(params.get("port") or DEFAULT_POSTGRES_PORT) == port)  # fmt: skip
    except (psycopg.ProgrammingError, ValueError):
        return dsn
    if not matches:
        return dsn
    parts = urlsplit(dsn)
    if parts.scheme in ("postgres", "postgresql") and parts.username and "@" in parts.netloc:
        # Keep the URL form (it is what status shows, masked): the password goes in the userinfo.
        user, _, host_port = parts.netloc.rpartition("@")
        return urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{host_port}"))
    return psycopg.conninfo.make_conninfo(dsn, password=password)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and for any loopback IP literal (127.0.0.0/8, ::1)."""
    if host.lower() in LOCALHOST_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _to_json(found: StackSecrets) -> str:
    return json.dumps({
        "version": FORMAT_VERSION,
        "redis": {"password": found.redis_password, "port": found.redis_port},
        "postgres": {"password": found.postgres_password, "port": found.postgres_port},
        **({"s3": {"access_key_id": keys.access_key_id, "secret_access_key": keys.secret_access_key,
                   "port": keys.port}} if (keys := found.object_store) else {}),
    }, indent=1) + "\n"  # fmt: skip


def _write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text``, readable by this user only (mkstemp makes it 0600)."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
        raise


def _object_store_keys(data: Any) -> ObjectStoreKeys | None:
    """The ``s3`` entry; None where the file has none (written before the object store existed)."""
    if data is None:
        return None
    return ObjectStoreKeys(access_key_id=_text(data["access_key_id"]),
                           secret_access_key=_text(data["secret_access_key"]), port=int(data["port"]))


def _text(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError("a password must be a non-empty string")
    return value
