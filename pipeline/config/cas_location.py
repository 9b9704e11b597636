"""Where the CAS is: ``cas.url`` parsed (pure), and the ``[cas.s3]`` section for an S3-compatible store.

``cas.url`` is one of:

- ``""``: a local folder, ``cas.root`` (under ``data_dir`` when relative), the embedded default;
- ``file:///absolute/path``: a local (or mounted) folder;
- ``s3://bucket`` or ``s3://bucket/prefix``: an S3-compatible object store (AWS S3, MinIO, SeaweedFS, R2,
  GCS's S3 API), reached as ``[cas.s3]`` says.

:func:`parse_cas_url` turns it into a :class:`FileLocation`, an :class:`S3Location` or None (the default);
the settings validate it at load time, so a bad URL fails before any process starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from shardfuse.pipeline.config.section import Section as _Section

# S3's rules for bucket names (the strict ones every S3-compatible store accepts): 3-63 lower-case letters,
# digits, dots and hyphens, starting and ending with a letter or digit.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
_FORMS = "'' (the folder cas.root), file:///absolute/path, or s3://bucket[/prefix]"


@dataclass(frozen=True)
class FileLocation:
    """A CAS in a local folder."""

    root: Path


@dataclass(frozen=True)
class S3Location:
    """A CAS in an S3 bucket, under ``prefix`` (no leading or trailing slash; may be empty)."""

    bucket: str
    prefix: str = ""

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def key_for(self, digest: str) -> str:
        """The object key of the content whose sha256 is ``digest`` (64 hex): ``<prefix>/<2 hex>/<62 hex>``,
        the local store's layout."""
        name = f"{digest[:2]}/{digest[2:]}"
        return f"{self.prefix}/{name}" if self.prefix else name


def parse_cas_url(url: str) -> FileLocation | S3Location | None:
    """``cas.url`` as a location; None for ``""`` (the folder ``cas.root``). ValueError, naming the
    setting and the accepted forms, for anything else."""
    if not url:
        return None
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ValueError(f"cas.url {url!r} is not a URL ({exc}); use {_FORMS}") from None
    if parts.query or parts.fragment:
        raise ValueError(f"cas.url {url!r}: a CAS URL takes no query or fragment; use {_FORMS}")
    if parts.scheme == "file":
        return _file_location(url, host=parts.netloc, path=parts.path)
    if parts.scheme == "s3":
        return _s3_location(url, netloc=parts.netloc, path=parts.path)
    raise ValueError(f"cas.url {url!r}: unsupported scheme {parts.scheme or '(none)'!r}; use {_FORMS}")


def _file_location(url: str, *, host: str, path: str) -> FileLocation:
    if host not in ("", "localhost"):
        raise ValueError(f"cas.url {url!r}: a file:// URL names a folder on this machine (file:///path), "
                         f"not on host {host!r}")
    root = Path(unquote(path))
    if not root.is_absolute() or root == Path("/"):
        raise ValueError(f"cas.url {url!r}: a file:// URL needs an absolute folder other than / "
                         "(file:///var/lib/shardfuse/cas); leave cas.url empty for cas.root under data_dir")
    return FileLocation(root)


def _s3_location(url: str, *, netloc: str, path: str) -> S3Location:
    if "@" in netloc:
        raise ValueError(f"cas.url {url!r}: credentials do not belong in the URL; set cas.s3.access_key_id "
                         "and cas.s3.secret_access_key, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    if not _BUCKET.fullmatch(netloc) or ".." in netloc:
        raise ValueError(f"cas.url {url!r}: {netloc!r} is not a valid bucket name (3-63 lower-case letters, "
                         "digits, dots and hyphens, starting and ending with a letter or digit)")
    segments = [unquote(segment) for segment in path.split("/") if segment]
    if any(segment in (".", "..") for segment in segments):
        raise ValueError(f"cas.url {url!r}: the prefix may not contain '.' or '..' segments")
    return S3Location(bucket=netloc, prefix="/".join(segments))


AddressingStyle = Literal["path", "virtual", "auto"]


class S3Settings(_Section):
    """How to reach the object store of an ``s3://`` ``cas.url``."""

    # "" is AWS S3 itself (the endpoint of ``region``); MinIO, SeaweedFS, R2 …: their URL (http://host:port).
    endpoint_url: str = ""
    region: str = "us-east-1"
    # "" leaves the credentials to boto3's default chain: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY in the
    # environment, ~/.aws, an instance profile or an IRSA / workload-identity role. Set both or neither.
    access_key_id: str = ""
    secret_access_key: SecretStr = SecretStr("")
    # "path" (https://host/bucket/key) suits MinIO and SeaweedFS; AWS prefers "virtual" (bucket.host).
    addressing_style: AddressingStyle = "path"
    # Content at least this large goes up as a multipart upload in parts of this size, at most
    # ``max_concurrency`` parts at a time; memory per transfer stays near parts × concurrency.
    multipart_threshold_mb: int = Field(default=16, ge=5, le=5120)
    part_size_mb: int = Field(default=16, ge=5, le=5120)
    max_concurrency: int = Field(default=4, ge=1, le=64)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    read_timeout_s: float = Field(default=60.0, gt=0)
    # How long one CAS operation keeps retrying an unreachable or failing store (the shared retry policy,
    # backoff with jitter) before the error reaches the caller (a worker then retries its message).
    retry_budget_s: float = Field(default=20.0, ge=0)

    @field_validator("endpoint_url")
    @classmethod
    def _http_endpoint(cls, url: str) -> str:
        if url:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
                raise ValueError(f"cas.s3.endpoint_url {url!r} must be an http:// or https:// URL with a host and "
                                 "no credentials (or empty for AWS S3)")
        return url

    @model_validator(mode="after")
    def _both_keys_or_neither(self) -> S3Settings:
        if bool(self.access_key_id) != bool(self.secret_access_key.get_secret_value()):
            raise ValueError("cas.s3.access_key_id and cas.s3.secret_access_key go together: set both, or neither "
                             "to use AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, ~/.aws or the machine's role")
        return self
