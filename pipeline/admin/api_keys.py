"""API keys of the HTTP API: each bound to the zones it may read and the zones it may write.

A token is 32 random bytes from :mod:`secrets` (``sfk_<id>_<43 url-safe characters>``), shown once when it is
made. Only its SHA-256 is kept: a plain (unsalted, fast) hash is enough for a token with 256 bits of entropy,
since nobody can guess a preimage however fast the hash is (password hashing's salts and slow functions exist for
low-entropy secrets people choose); it also lets ``api.keys`` in a deployment's settings hold the same hash. A
presented token is hashed and compared with every known hash by :func:`hmac.compare_digest`, so the time taken
says nothing about how close a guess came.

Two sources, used together (:class:`KeyRing`): the key store file ``<data_dir>/api-keys.json`` (mode 0600,
managed by ``shardfuse api-key``; re-read when it changes, so a revoke takes effect at the next request) and
``api.keys`` in the settings (hashes in a config file or a Kubernetes Secret: a cluster's API replicas need no
shared filesystem and no database round trip to authenticate).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from shardfuse.pipeline.config.api import ALL_ZONES, ApiKeyEntry
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.durable_files import atomic_write_bytes
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.core.zones import check_zone

TOKEN_PREFIX = "sfk_"
STORE_VERSION = 1


def hash_token(token: str) -> str:
    """The SHA-256 (hex) a token is known by."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token(key_id: str) -> str:
    """A fresh token for the key ``key_id`` (its id is in it, so a log line of a refused token can name a key
    without holding a secret)."""
    return f"{TOKEN_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"


def zone_list(zones: Iterable[str]) -> tuple[str, ...]:
    """Zone names for a key, checked (``*``: every zone), in order, once each."""
    checked = [zone if zone == ALL_ZONES else check_zone(zone) for zone in zones]
    return tuple(dict.fromkeys(checked))


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One key: what it is called, its hash, and the zones it may read and write."""

    key_id: str
    name: str
    sha256: str
    read: tuple[str, ...]
    write: tuple[str, ...]
    created: float = 0.0
    source: str = "store"  # "store" (the key store file) or "settings" (api.keys)

    def may_read(self, zone: str) -> bool:
        return ALL_ZONES in self.read or zone in self.read

    def may_write(self, zone: str) -> bool:
        return ALL_ZONES in self.write or zone in self.write

    def public(self) -> dict[str, object]:
        """What ``api-key list`` shows: everything but the hash."""
        return {"id": self.key_id, "name": self.name, "read": list(self.read), "write": list(self.write),
                "created": self.created, "source": self.source}


def from_entry(entry: ApiKeyEntry) -> ApiKey:
    """A key of ``api.keys`` (its id: the first 8 hex of its hash)."""
    return ApiKey(key_id=entry.sha256[:8], name=entry.name, sha256=entry.sha256, read=zone_list(entry.read),
                  write=zone_list(entry.write), source="settings")


class KeyStore:
    """The key store file: a JSON list of keys (hashes only), written atomically with mode 0600."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[ApiKey]:
        """The stored keys; none if there is no file. A file that is not a key store is a ConfigurationError."""
        try:
            raw = json.loads(self.path.read_bytes())
            return [ApiKey(**{**row, "read": tuple(row["read"]), "write": tuple(row["write"])})
                    for row in raw["keys"]]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigurationError(f"cannot read the API key store {self.path}: {exc}; fix or remove it "
                                     "(`shardfuse api-key create` makes a new one)") from exc

    def create(self, *, name: str, read: Iterable[str], write: Iterable[str]) -> tuple[ApiKey, str]:
        """Make a key, store its hash, and return it with its token (the only time the token exists)."""
        try:
            read_zones, write_zones = zone_list(read), zone_list(write)
        except ValueError as exc:
            raise ConfigurationError(f"zone {exc}") from exc
        if not read_zones and not write_zones:
            raise ConfigurationError("a key needs at least one zone: --read ZONE and/or --write ZONE")
        keys = self.load()
        if any(key.name == name for key in keys):
            raise ConfigurationError(f"a key named {name!r} exists already; pick another name or revoke it first")
        key_id = secrets.token_hex(4)
        token = new_token(key_id)
        key = ApiKey(key_id=key_id, name=name, sha256=hash_token(token), read=read_zones, write=write_zones,
                     created=round(time.time(), 3))
        self._save([*keys, key])
        return key, token

    def revoke(self, name_or_id: str) -> ApiKey:
        """Remove the key with this name or id; ConfigurationError if there is none."""
        keys = self.load()
        gone = [key for key in keys if name_or_id in (key.name, key.key_id)]
        if not gone:
            raise ConfigurationError(f"no API key named {name_or_id!r} in {self.path} "
                                     "(`shardfuse api-key list` shows them; keys in api.keys are removed there)")
        self._save([key for key in keys if key not in gone])
        return gone[0]

    def _save(self, keys: list[ApiKey]) -> None:
        rows = [{k: v for k, v in asdict(key).items() if k != "source"} for key in keys]
        data = json.dumps({"version": STORE_VERSION, "keys": rows}, indent=1).encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.path, data, tmp_prefix=".api-keys-")
        os.chmod(self.path, 0o600)  # hashes only, yet nobody else's business which zones a key opens


class KeyRing:
    """Every key the API accepts: ``api.keys`` plus the key store file, re-read when the file changes."""

    def __init__(self, *, store: KeyStore, configured: Iterable[ApiKeyEntry] = ()) -> None:
        self._store = store
        self._configured = [from_entry(entry) for entry in configured]
        self._lock = threading.Lock()
        self._seen: tuple[int, int] | None = None
        self._stored: list[ApiKey] = []

    def keys(self) -> list[ApiKey]:
        """The keys as of now (the store file's latest version)."""
        with self._lock:
            try:
                info = self._store.path.stat()
                version: tuple[int, int] | None = (info.st_mtime_ns, info.st_ino)
            except FileNotFoundError:
                version = None
            if version != self._seen:
                self._stored = self._store.load() if version is not None else []
                self._seen = version
            return [*self._configured, *self._stored]

    def authenticate(self, token: str) -> ApiKey | None:
        """The key whose token this is, or None. Every key's hash is compared, in constant time each."""
        presented = hash_token(token)
        found = None
        for key in self.keys():
            if hmac.compare_digest(presented, key.sha256):
                found = key
        return found


def key_store(settings: Settings) -> KeyStore:
    """The key store file ``api.keys_file`` names (relative: under the data dir)."""
    path = settings.api.keys_file.expanduser()
    return KeyStore(path if path.is_absolute() else settings.data_path / path)


def key_ring(settings: Settings) -> KeyRing:
    """Every key the settings accept: ``api.keys`` and the key store file."""
    return KeyRing(store=key_store(settings), configured=settings.api.keys)
