"""The HTTP API (``shardfuse api``, :mod:`shardfuse.workers.http`): where it listens, its keys and its limits
(a section of :class:`shardfuse.pipeline.config.settings.Settings`)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field

from shardfuse.pipeline.config.section import Section as _Section

# Every zone, in a key's read or write list (no zone name can be "*": pipeline/core/zones.py).
ALL_ZONES = "*"
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _sha256_hex(value: str) -> str:
    if not SHA256_HEX.fullmatch(value):
        raise ValueError("is not a key hash: 64 lowercase hex digits (`shardfuse api-key create` prints it)")
    return value


class ApiKeyEntry(_Section):
    """One API key as a deployment configures it (``api.keys``): never the token, only its SHA-256."""

    name: str = Field(min_length=1, max_length=100)
    sha256: Annotated[str, AfterValidator(_sha256_hex)]
    read: tuple[str, ...] = ()  # zones it may search and see the status of; "*": every zone
    write: tuple[str, ...] = ()  # zones it may upload to and delete from; "*": every zone


def _json_list(value: Any) -> Any:
    """``api.keys`` given as JSON text (a Secret's value handed over as a keyword override, not the environment)."""
    return json.loads(value) if isinstance(value, str) else value


class ApiSettings(_Section):
    host: str = "127.0.0.1"  # `shardfuse api` (the embedded stack's API listens on stack.api_port instead)
    port: int = Field(default=8080, ge=1, le=65535)
    # Keys from the settings (a deployment's Secret: SHARDFUSE_API__KEYS='[{"name": ..., "sha256": ..., ...}]'),
    # used together with the key store file below; a cluster needs no shared filesystem for its keys.
    keys: Annotated[tuple[ApiKeyEntry, ...], BeforeValidator(_json_list)] = ()
    # The key store `shardfuse api-key` manages (mode 0600; relative: under data_dir). Re-read when it changes.
    keys_file: Path = Path("api-keys.json")
    # A JSON request's body (search); larger: 413, before any of it is parsed.
    max_request_bytes: int = Field(default=1024 * 1024, ge=1024)
    # An upload's content, counted while it streams in; larger: 413 and nothing published. 0: limits.max_file_bytes.
    max_upload_bytes: int = Field(default=0, ge=0)
    # Per key, across every API process (a token bucket in the broker's Redis): refilled at rate_per_s, at most
    # burst requests at once. 0: no limit.
    rate_per_s: float = Field(default=20.0, ge=0)
    burst: int = Field(default=40, ge=1)
    # Searches one API process has in flight at once (each holds one RPC client); more wait their turn.
    search_concurrency: int = Field(default=8, ge=1, le=256)
