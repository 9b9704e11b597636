"""The CAS in an S3-compatible object store (AWS S3, MinIO, SeaweedFS, R2, GCS's S3 API), on boto3.

Objects are keyed like the local store's files: ``<prefix>/<2 hex>/<62 hex>`` of the content's sha256.
``put`` asks first (HEAD) and uploads only what is missing, so storing the same content again costs one small
request; ``get`` and ``copy_to`` verify what they read against its name. Files go up and come down streamed:
``put_file`` hashes the file in one pass, then uploads it (multipart above ``cas.s3.multipart_threshold_mb``,
at most ``max_concurrency`` parts of ``part_size_mb`` in memory); ``copy_to`` writes the body out in 1 MiB
chunks. Errors are translated in :mod:`shardfuse.pipeline.storage.s3_errors`.

Retries: ONE policy, the project's (:func:`shardfuse.pipeline.core.http_api.retries.call_with_retries`:
jittered exponential backoff within ``cas.s3.retry_budget_s``, counted and logged like every provider's).
botocore's own retries are off (``total_max_attempts=1``): left on, its attempts would multiply ours
(3 × N requests against a store that is down, a budget nobody set) and hide failures from our metrics. The
price: a multipart upload that fails part-way is retried whole (s3transfer aborts the failed one); CAS
content is bounded by ``limits.max_file_bytes``, so that is a rare and bounded cost.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TypeVar

import boto3
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.config import Config
from botocore.exceptions import ClientError

from shardfuse.pipeline.config.cas_location import S3Location, S3Settings
from shardfuse.pipeline.core.errors import ConfigurationError, ContentNotFoundError, PermanentError, ShardfuseError
from shardfuse.pipeline.core.events import hex_digest
from shardfuse.pipeline.core.http_api.retries import call_with_retries
from shardfuse.pipeline.storage.s3_errors import (
    Failure,
    S3Target,
    classify,
    missing_bucket_message,
    not_found_message,
    translate,
)
from shardfuse.pipeline.storage.streams import (
    CHUNK_BYTES,
    Bounded,
    Stored,
    copy_verified,
    file_identity,
    hashed_file,
)

if TYPE_CHECKING:
    from botocore.response import StreamingBody
    from mypy_boto3_s3 import S3Client

T = TypeVar("T")
MIB = 1024 * 1024


def s3_client(settings: S3Settings) -> S3Client:
    """A boto3 S3 client as ``settings`` say: explicit keys or boto3's default credential chain, path or
    virtual addressing, our timeouts, botocore's retries off (see the module docstring)."""
    config = Config(
        region_name=settings.region,
        signature_version="s3v4",
        s3={"addressing_style": settings.addressing_style},
        retries={"mode": "standard", "total_max_attempts": 1},
        connect_timeout=settings.connect_timeout_s,
        read_timeout=settings.read_timeout_s,
        max_pool_connections=max(10, 2 * settings.max_concurrency + 4),
        user_agent_extra="shardfuse",
    )
    secret = settings.secret_access_key.get_secret_value()
    # A session of its own: boto3's default session is a module global that is not thread-safe.
    session = boto3.session.Session()
    return session.client(
        "s3",
        endpoint_url=settings.endpoint_url or None,
        aws_access_key_id=settings.access_key_id or None,
        aws_secret_access_key=secret or None,
        config=config,
    )


class S3ContentStore:
    """A CAS in ``location`` (bucket and prefix) of the object store ``settings`` describe."""

    def __init__(self, *, location: S3Location, settings: S3Settings, client: S3Client | None = None) -> None:
        self._location = location
        self._settings = settings
        self._client = client if client is not None else s3_client(settings)
        self._target = S3Target(
            url=location.url, bucket=location.bucket, explicit_keys=bool(settings.access_key_id),
            endpoint=settings.endpoint_url or f"AWS S3 ({settings.region})",
        )  # fmt: skip

    @property
    def location(self) -> S3Location:
        return self._location

    def key_for(self, content_hash: str) -> str:
        """The object key of ``content_hash``; :class:`InvalidEventError` for a malformed hash."""
        return self._location.key_for(hex_digest(content_hash))

    # -- the ContentStore port -------------------------------------------------------------------------
    def put(self, data: bytes) -> str:
        """Store ``data`` unless the store holds it already; return its hash."""
        name = "sha256:" + hashlib.sha256(data).hexdigest()
        key = self.key_for(name)
        if self._head(key, name) is None:
            self._call(f"write {name}", lambda: self._client.put_object(Bucket=self._bucket, Key=key, Body=data))
        return name

    def get(self, content_hash: str) -> bytes:
        """The bytes of ``content_hash``, verified."""
        buffer = BytesIO()
        self.copy_to(content_hash, buffer)
        return buffer.getvalue()

    def exists(self, content_hash: str) -> bool:
        """Whether the object of ``content_hash`` exists (one HEAD; its content is not re-verified)."""
        return self._head(self.key_for(content_hash), content_hash) is not None

    def size(self, content_hash: str) -> int:
        """The size of the object of ``content_hash``, from a HEAD (the content is not read)."""
        head = self._head(self.key_for(content_hash), content_hash)
        if head is None:
            # A HEAD's 404 has no body to tell a missing object from a missing bucket: ask.
            self._require_bucket()
            raise ContentNotFoundError(not_found_message(self._target.describe(), content_hash))
        return head

    def get_within(self, content_hash: str, max_bytes: int) -> Bounded:
        """One GET: its ``Content-Length`` says the size, and the body is read (and verified) only if it is
        within ``max_bytes``; otherwise the connection is closed unread. A HEAD and then a GET, as ingest
        asked before, cost two round trips per document."""
        key = self.key_for(content_hash)

        def read() -> Bounded:
            response = self._client.get_object(Bucket=self._bucket, Key=key)
            size = int(response["ContentLength"])
            if size > max_bytes:
                response["Body"].close()
                return Bounded(size, None)
            out = BytesIO()
            self._drain(response["Body"], out, key=key, content_hash=content_hash)
            return Bounded(size, out.getvalue())

        return self._call(f"read {content_hash}", read, content_hash=content_hash)

    def put_file(self, path: Path) -> Stored:
        """Store the file ``path``: hashed in one streamed pass, then uploaded (multipart when large) unless
        the store holds it. A file that changes meanwhile is refused, and its upload removed."""
        before = file_identity(path)
        if before[1] < self._settings.multipart_threshold_mb * MIB:
            data = path.read_bytes()  # small: one read, hashed and sent from the same bytes
            return Stored(self.put(data), len(data))
        stored = hashed_file(path)
        name = stored.content_hash
        key = self.key_for(name)
        if self._head(key, name) is not None:
            return stored
        self._call(f"upload {path} as {name}", lambda: self._upload(path, key))
        if file_identity(path) != before:
            self._call(f"remove the changed upload {name}",
                       lambda: self._client.delete_object(Bucket=self._bucket, Key=key))  # fmt: skip
            raise PermanentError(f"{path} changed while it was being stored in the CAS: store it again once "
                                 "nothing writes to it")
        return stored

    def copy_to(self, content_hash: str, out: BinaryIO) -> int:
        """Stream the object of ``content_hash`` into ``out``, verifying the hash. A seekable ``out`` is
        rewound to where it started before each retry; an unseekable one is not retried."""
        key = self.key_for(content_hash)
        start = out.tell() if out.seekable() else None

        def download() -> int:
            if start is not None:
                out.seek(start)
                out.truncate()
            body = self._client.get_object(Bucket=self._bucket, Key=key)["Body"]
            return self._drain(body, out, key=key, content_hash=content_hash)

        return self._call(f"read {content_hash}", download, content_hash=content_hash, retry=start is not None)

    def _drain(self, body: StreamingBody, out: BinaryIO, *, key: str, content_hash: str) -> int:
        """Copy a GET's streamed ``body`` (of object ``key``) into ``out``, verified against ``content_hash``,
        and close it; its size."""
        try:
            return copy_verified(body.iter_chunks(CHUNK_BYTES), out, content_hash=content_hash,
                                 where=f"object s3://{self._bucket}/{key}")
        finally:
            body.close()

    # -- the embedded stack ------------------------------------------------------------------------------
    def ensure_bucket(self) -> bool:
        """Create the bucket if it does not exist; True if it was created. For stores this deployment owns
        (``shardfuse up``'s embedded one): elsewhere a missing bucket is an error to fix, not to paper over."""
        if self._bucket_exists():
            return False
        kwargs = {} if self._settings.region == "us-east-1" else {
            "CreateBucketConfiguration": {"LocationConstraint": self._settings.region}}

        def create() -> None:
            try:
                self._client.create_bucket(Bucket=self._bucket, **kwargs)  # type: ignore[arg-type]
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise

        self._call(f"create the bucket {self._bucket!r}", create)
        return True

    def close(self) -> None:
        """Close the client's connections."""
        self._client.close()

    # -- helpers -------------------------------------------------------------------------------------------
    @property
    def _bucket(self) -> str:
        return self._location.bucket

    def _upload(self, path: Path, key: str) -> None:
        s = self._settings
        config = TransferConfig(
            multipart_threshold=s.multipart_threshold_mb * MIB, multipart_chunksize=s.part_size_mb * MIB,
            max_concurrency=s.max_concurrency, num_download_attempts=1, preferred_transfer_client="classic",
        )  # fmt: skip
        with create_transfer_manager(self._client, config) as manager:
            manager.upload(str(path), self._bucket, key).result()

    def _head(self, key: str, content_hash: str) -> int | None:
        """The size of the object ``key``, or None if there is none."""

        def head() -> int | None:
            try:
                return self._client.head_object(Bucket=self._bucket, Key=key)["ContentLength"]
            except ClientError as exc:
                if classify(exc) is Failure.NOT_FOUND:
                    return None
                raise

        return self._call(f"look up {content_hash}", head)

    def _bucket_exists(self) -> bool:
        def head() -> bool:
            try:
                self._client.head_bucket(Bucket=self._bucket)
                return True
            except ClientError as exc:
                if classify(exc) in (Failure.NOT_FOUND, Failure.NO_BUCKET):
                    return False
                raise

        return self._call(f"look up the bucket {self._bucket!r}", head)

    def _require_bucket(self) -> None:
        if not self._bucket_exists():
            raise ConfigurationError(missing_bucket_message(self._target))

    def _call(self, action: str, fn: Callable[[], T], *, content_hash: str | None = None, retry: bool = True) -> T:
        """``fn()`` with boto3's errors translated, retried on transient ones (the shared policy)."""

        def attempt() -> T:
            try:
                return fn()
            except ShardfuseError:
                raise
            except Exception as exc:
                raise translate(exc, action=action, target=self._target, content_hash=content_hash) from exc

        return call_with_retries(attempt, max_retry_s=self._settings.retry_budget_s, provider="s3",
                                 max_attempts=None if retry else 1)  # fmt: skip
