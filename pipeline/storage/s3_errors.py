"""boto3's errors as ours, for the S3 CAS adapter (pure: no client, no I/O).

- an object that is not there (``NoSuchKey``, a HEAD's bare 404) → :class:`ContentNotFoundError`
  (permanent; the same recovery hint as the local store);
- the bucket missing (``NoSuchBucket``) → :class:`ConfigurationError` naming the bucket and ``cas.url``;
- credentials refused (``InvalidAccessKeyId``, ``SignatureDoesNotMatch``, ``AccessDenied``, a bare 403) or
  none found → :class:`ConfigurationError` naming ``cas.s3.access_key_id`` and the environment variables;
- the store out of reach or failing (connection refused or reset, timeouts, 5xx, throttling) →
  :class:`StoreUnavailableError` (transient: retried);
- any other refusal (a 4xx we do not know) → :class:`PermanentError` with the store's own words.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    CredentialRetrievalError,
    NoCredentialsError,
    ParamValidationError,
    PartialCredentialsError,
)

from shardfuse.pipeline.core.errors import (
    ConfigurationError,
    ContentNotFoundError,
    PermanentError,
    ShardfuseError,
    StoreUnavailableError,
)


class Failure(enum.Enum):
    NOT_FOUND = "not found"
    NO_BUCKET = "no bucket"
    CREDENTIALS = "credentials"
    UNAVAILABLE = "unavailable"
    REJECTED = "rejected"


_CODES: dict[str, Failure] = {
    **dict.fromkeys(("NoSuchKey", "404", "NotFound"), Failure.NOT_FOUND),
    "NoSuchBucket": Failure.NO_BUCKET,
    **dict.fromkeys(("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403", "Forbidden",
                     "InvalidToken", "InvalidClientTokenId", "AuthorizationHeaderMalformed", "AllAccessDisabled"),
                    Failure.CREDENTIALS),
    # ExpiredToken: boto3 refreshes role credentials on the next call; RequestTimeout: the store gave up on a
    # slow upload.
    **dict.fromkeys(("SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
                     "RequestTimeout", "ServiceUnavailable", "InternalError", "ExpiredToken", "OperationAborted"),
                    Failure.UNAVAILABLE),
}  # fmt: skip


def classify(exc: BaseException) -> Failure:
    """Which of our failures ``exc`` (raised by boto3 or s3transfer) is."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        known = _CODES.get(str(error.get("Code", "")))
        if known is not None:
            return known
        return Failure.UNAVAILABLE if status >= 500 or status == 429 or status == 0 else Failure.REJECTED
    if isinstance(exc, NoCredentialsError | PartialCredentialsError | CredentialRetrievalError):
        return Failure.CREDENTIALS
    if isinstance(exc, ParamValidationError):
        return Failure.REJECTED
    # Connection refused or reset, timeouts, a body cut short (botocore's ConnectionError, HTTPClientError,
    # IncompleteReadError …), and whatever else botocore or the socket layer raises: the store, not the request.
    if isinstance(exc, BotoCoreError | OSError):
        return Failure.UNAVAILABLE
    return Failure.REJECTED


@dataclass(frozen=True)
class S3Target:
    """What an error message names: the CAS URL, the endpoint, and where the credentials came from."""

    url: str
    bucket: str
    endpoint: str
    explicit_keys: bool

    def describe(self) -> str:
        return f"the CAS {self.url} at {self.endpoint}"


def translate(exc: BaseException, *, action: str, target: S3Target, content_hash: str | None = None) -> ShardfuseError:
    """``exc``, raised while doing ``action`` (a phrase: "read sha256:…"), as one of our errors."""
    failure = classify(exc)
    detail = _detail(exc)
    where = target.describe()
    if failure is Failure.NOT_FOUND and content_hash is not None:
        return ContentNotFoundError(not_found_message(where, content_hash))
    if failure is Failure.NO_BUCKET or failure is Failure.NOT_FOUND:
        return ConfigurationError(missing_bucket_message(target))
    if failure is Failure.CREDENTIALS:
        return ConfigurationError(f"cannot {action}: {where} refused the credentials ({detail}); "
                                  f"{credentials_hint(target)}")
    if failure is Failure.UNAVAILABLE:
        return StoreUnavailableError(f"cannot {action} in {where}: {detail}")
    return PermanentError(f"cannot {action}: {where} refused the request ({detail})")


def not_found_message(where: str, content_hash: str) -> str:
    """The local store's message for content it does not hold (same recovery)."""
    return (f"{where} holds no content {content_hash}: put the content in the CAS before publishing its event "
            "(the publisher does), then retry this dead letter (`shardfuse deadletters retry ID`)")


def missing_bucket_message(target: S3Target) -> str:
    return (f"the bucket {target.bucket!r} of cas.url ({target.url}) does not exist at {target.endpoint}: "
            "create it (the embedded stack's `shardfuse up` does), or fix cas.url / cas.s3.endpoint_url")


def credentials_hint(target: S3Target) -> str:
    # AWS answers a HEAD of a missing key with 403 when the key may not list the bucket: say so.
    rights = "that it may read, write and list the bucket (s3:GetObject, s3:PutObject, s3:ListBucket)"
    if target.explicit_keys:
        return ("check cas.s3.access_key_id and cas.s3.secret_access_key (SHARDFUSE_CAS__S3__ACCESS_KEY_ID, "
                f"SHARDFUSE_CAS__S3__SECRET_ACCESS_KEY) and {rights}")
    return ("cas.s3.access_key_id is empty, so the key came from boto3's default chain (AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, ~/.aws, the machine's or pod's role): check it and "
            f"{rights}, or set cas.s3.access_key_id and cas.s3.secret_access_key")


def _detail(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code, message = error.get("Code", "?"), error.get("Message", "")
        return f"HTTP {status} {code}" + (f": {message}" if message and message != code else "")
    return f"{type(exc).__name__}: {exc}"
