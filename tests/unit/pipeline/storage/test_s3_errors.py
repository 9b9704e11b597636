"""boto3's failures as our errors. The error responses are those a real S3 server (SeaweedFS 4.48) answered,
as botocore parses them (tests/integration/test_s3_cas.py checks the same outcomes end to end)."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
    ResponseStreamingError,
)

from shardfuse.pipeline.core.errors import (
    ConfigurationError,
    ContentNotFoundError,
    PermanentError,
    StoreUnavailableError,
    TransientError,
)
from shardfuse.pipeline.storage.s3_errors import S3Target, translate

HASH = "sha256:" + "0" * 64
TARGET = S3Target(url="s3://cas-bucket/p", bucket="cas-bucket", endpoint="http://127.0.0.1:8333", explicit_keys=True)


def client_error(code: str, status: int, message: str = "", operation: str = "GetObject") -> ClientError:
    response: Any = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, operation)


@pytest.mark.parametrize(
    "exc",
    [client_error("NoSuchKey", 404, "The specified key does not exist."), client_error("404", 404, "Not Found",
                                                                                        "HeadObject")],
)
def test_a_missing_object_is_content_not_found_with_the_recovery(exc: Exception) -> None:
    error = translate(exc, action=f"read {HASH}", target=TARGET, content_hash=HASH)
    assert isinstance(error, ContentNotFoundError)
    assert HASH in str(error) and "shardfuse deadletters retry" in str(error) and "s3://cas-bucket/p" in str(error)


def test_a_missing_bucket_names_the_bucket() -> None:
    error = translate(client_error("NoSuchBucket", 404, "The specified bucket does not exist"),
                      action=f"read {HASH}", target=TARGET, content_hash=HASH)
    assert isinstance(error, ConfigurationError)
    assert "bucket 'cas-bucket' of cas.url (s3://cas-bucket/p) does not exist at http://127.0.0.1:8333" in str(error)


@pytest.mark.parametrize(
    "exc",
    [
        client_error("SignatureDoesNotMatch", 403, "The request signature we calculated does not match"),
        client_error("InvalidAccessKeyId", 403, "The access key ID you provided does not exist in our records."),
        client_error("403", 403, "Forbidden", "HeadObject"),  # a HEAD's refusal has no body
        client_error("AccessDenied", 403, "Access Denied"),
    ],
)
def test_refused_credentials_name_the_settings(exc: Exception) -> None:
    error = translate(exc, action=f"read {HASH}", target=TARGET, content_hash=HASH)
    assert isinstance(error, ConfigurationError) and not isinstance(error, TransientError)
    assert "refused the credentials" in str(error) and "cas.s3.access_key_id" in str(error)
    assert "SHARDFUSE_CAS__S3__SECRET_ACCESS_KEY" in str(error)


def test_credentials_from_the_environment_are_named_as_such() -> None:
    from_chain = S3Target(url="s3://b", bucket="b", endpoint="AWS S3 (us-east-1)", explicit_keys=False)
    for exc in (client_error("InvalidAccessKeyId", 403), NoCredentialsError()):
        error = translate(exc, action="write it", target=from_chain)
        assert isinstance(error, ConfigurationError)
        assert "AWS_ACCESS_KEY_ID" in str(error) and "cas.s3.access_key_id is empty" in str(error)


@pytest.mark.parametrize(
    "exc",
    [
        EndpointConnectionError(endpoint_url="http://127.0.0.1:8333/b/k"),
        ConnectTimeoutError(endpoint_url="http://127.0.0.1:8333/b/k"),
        ReadTimeoutError(endpoint_url="http://127.0.0.1:8333/b/k"),
        ResponseStreamingError(error="Connection broken: IncompleteRead"),
        client_error("SlowDown", 503, "Please reduce your request rate."),
        client_error("InternalError", 500, "We encountered an internal error."),
        client_error("ServiceUnavailable", 503),
        client_error("Whatever", 502),
        client_error("TooManyRequests", 429),
        ConnectionResetError(104, "Connection reset by peer"),
    ],
)
def test_the_store_out_of_reach_or_failing_is_transient(exc: Exception) -> None:
    error = translate(exc, action=f"read {HASH}", target=TARGET, content_hash=HASH)
    assert isinstance(error, StoreUnavailableError)
    assert f"cannot read {HASH} in the CAS s3://cas-bucket/p at http://127.0.0.1:8333" in str(error)


@pytest.mark.parametrize(
    "exc", [client_error("InvalidArgument", 400, "Invalid argument"), ParamValidationError(report="bad Key")]
)
def test_other_refusals_are_permanent_with_the_stores_words(exc: Exception) -> None:
    error = translate(exc, action="write it", target=TARGET)
    assert type(error) is PermanentError and "refused the request" in str(error)
