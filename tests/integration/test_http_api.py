"""The HTTP API as a client sees it: a real stack (`shardfuse up` starts the API process on stack.api_port) and a
real HTTP client (httpx). Search, upload, delete and status; zone A's key refused (403) on zone B by every
endpoint; oversize upload 413 with nothing published; bad JSON 422 with the field named and the CLI's message;
429 with Retry-After; the OpenAPI document validates."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterator

import httpx
import pytest
from openapi_spec_validator import validate

from shardfuse.pipeline.admin.api_keys import hash_token
from shardfuse.pipeline.storage.opening import open_content_store
from shardfuse.workers.stack import api_process
from tests.integration.conftest import Stack, running_stack

pytestmark = pytest.mark.integration

MAX_UPLOAD = 64 * 1024
# A key from the settings (api.keys: a hash, as a deployment's Secret holds it), reading every zone.
ADMIN_TOKEN = "sfk_settings_" + "s" * 43
TIMEOUT = httpx.Timeout(30.0)


@pytest.fixture(scope="module")
def api_stack() -> Iterator[Stack]:
    overrides = {
        "SHARDFUSE_EMBEDDER__PROVIDER": "hashing",
        "SHARDFUSE_BM25__REBUILD_DEBOUNCE_S": "0.2",
        "SHARDFUSE_SHARDS": "2",
        "SHARDFUSE_API__MAX_UPLOAD_BYTES": str(MAX_UPLOAD),
        # Few enough that a loop of requests outruns the refill on any machine; enough for the other tests.
        "SHARDFUSE_API__RATE_PER_S": "2",
        "SHARDFUSE_API__BURST": "20",
        "SHARDFUSE_API__KEYS": json.dumps([{"name": "admin", "sha256": hash_token(ADMIN_TOKEN), "read": ["*"]}]),
    }
    with running_stack(overrides) as running:
        yield running


@pytest.fixture(scope="module")
def http(api_stack: Stack) -> Iterator[httpx.Client]:
    base = api_process.recorded_url(api_stack.settings, api_stack.state)
    assert base, "up started no API"
    with httpx.Client(base_url=base, timeout=TIMEOUT) as client:
        yield client


def _create_key(stack: Stack, name: str, *zones: str) -> str:
    flags = [flag for zone in zones for flag in ("--read", zone, "--write", zone)]
    out = stack.cli("api-key", "create", "--name", name, *flags).stdout
    token = re.search(r"^(sfk_\S+)$", out, re.MULTILINE)
    assert token, out
    listed = stack.cli("api-key", "list").stdout
    assert name in listed and token.group(1) not in listed  # list never prints a token
    return token.group(1)


@pytest.fixture(scope="module")
def zone_a(api_stack: Stack) -> dict[str, str]:
    return {"Authorization": f"Bearer {_create_key(api_stack, 'zone-a', 'a')}"}


def test_the_openapi_document_validates(http: httpx.Client) -> None:
    answer = http.get("/openapi.json")
    assert answer.status_code == 200
    document = answer.json()
    validate(document)  # raises if it is not a valid OpenAPI 3.1 document
    assert {"/v1/search", "/v1/documents", "/v1/status", "/healthz", "/readyz"} <= set(document["paths"])
    assert "query" in document["components"]["schemas"]["SearchRequest"]["properties"]


def test_probes_answer_without_a_key(http: httpx.Client) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    ready = http.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"] == {"broker": "ok", "postgres": "ok", "cas": "ok"}


def test_upload_then_search_finds_it_then_delete_and_it_is_gone(
        api_stack: Stack, http: httpx.Client, zone_a: dict[str, str]) -> None:
    body = b"# Harbour\n\nThe lighthouse keeper logs every quokkaberry shipment at dawn.\n"
    accepted = http.post("/v1/documents", params={"zone": "a", "path": "notes/harbour.md",
                                                  "metadata": json.dumps({"team": "docks"})},
                         content=body, headers={**zone_a, "Content-Type": "text/markdown"})
    assert accepted.status_code == 202, accepted.text
    identity = accepted.json()
    assert identity["content_hash"] == "sha256:" + hashlib.sha256(body).hexdigest()
    assert identity["zone"] == "a" and identity["path"] == "notes/harbour.md" and identity["size"] == len(body)
    assert identity["seq"] > 0 and identity["event_id"]
    api_stack.wait()

    found = http.post("/v1/search", json={"query": "quokkaberry shipment", "zone": "a", "k": 3,
                                          "filters": {"team": "docks"}}, headers=zone_a)
    assert found.status_code == 200, found.text
    assert [hit["path"] for hit in found.json()["results"]][:1] == ["notes/harbour.md"]

    status = http.get("/v1/status", headers=zone_a)
    assert status.status_code == 200
    zones = {row["zone"] for shard in status.json()["shard_counts"] for row in shard["zones"]}
    assert zones == {"a"} and "processes" not in status.json()  # the key's zones; no addresses or pids

    gone = http.request("DELETE", "/v1/documents", params={"zone": "a", "path": "notes/harbour.md"}, headers=zone_a)
    assert gone.status_code == 202 and gone.json()["op"] == "delete" and gone.json()["seq"] > identity["seq"]
    api_stack.wait()
    after = http.post("/v1/search", json={"query": "quokkaberry shipment", "zone": "a"}, headers=zone_a)
    assert after.status_code == 200 and after.json()["results"] == []


def test_a_zone_a_key_gets_403_on_zone_b_from_every_endpoint(
        api_stack: Stack, http: httpx.Client, zone_a: dict[str, str]) -> None:
    b = "b"
    answers = {
        "search": http.post("/v1/search", json={"query": "anything", "zone": b}, headers=zone_a),
        "search zones": http.post("/v1/search", json={"query": "anything", "zones": ["a", b]}, headers=zone_a),
        "upload": http.post("/v1/documents", params={"zone": b, "path": "x.txt"}, content=b"x", headers=zone_a),
        "delete": http.request("DELETE", "/v1/documents", params={"zone": b, "path": "x.txt"}, headers=zone_a),
        "status": http.get("/v1/status", params={"zone": b}, headers=zone_a),
    }
    assert {name: answer.status_code for name, answer in answers.items()} == dict.fromkeys(answers, 403)
    assert answers["upload"].json()["error"] == {"code": "forbidden",
                                                 "message": "API key 'zone-a' may not write zone 'b'"}
    # ...and the key from the settings, reading every zone, may search b (nothing is there).
    admin = http.post("/v1/search", json={"query": "anything", "zone": b},
                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert admin.status_code == 200 and admin.json()["results"] == []
    for headers in ({}, {"Authorization": "Bearer sfk_unknown_token"}):
        assert http.get("/v1/status", headers=headers).status_code == 401


def test_an_oversize_upload_is_413_and_nothing_is_published(
        api_stack: Stack, http: httpx.Client, zone_a: dict[str, str]) -> None:
    content = b"too big " * (MAX_UPLOAD // 4)
    declared = http.post("/v1/documents", params={"zone": "a", "path": "big.txt"}, content=content, headers=zone_a)
    streamed = http.post("/v1/documents", params={"zone": "a", "path": "big.txt"}, headers=zone_a,
                         content=(content[i:i + 8192] for i in range(0, len(content), 8192)))  # chunked: no length
    for answer in (declared, streamed):
        assert answer.status_code == 413, answer.text
        assert answer.json()["error"]["message"] == (f"the upload is larger than api.max_upload_bytes "
                                                     f"({MAX_UPLOAD:,} bytes); nothing was published")
    assert not open_content_store(api_stack.settings).exists("sha256:" + hashlib.sha256(content).hexdigest())
    api_stack.wait()
    answer = http.post("/v1/search", json={"query": "too big", "zone": "a", "mode": "keyword"}, headers=zone_a)
    assert "big.txt" not in [hit["path"] for hit in answer.json()["results"]]


def test_bad_json_is_422_naming_the_field_with_the_cli_message(
        api_stack: Stack, http: httpx.Client, zone_a: dict[str, str]) -> None:
    answer = http.post("/v1/search", json={"query": "x", "zone": "a", "k": 0}, headers=zone_a)
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error["code"] == "invalid_request" and error["fields"] == ["k"]
    cli = api_stack.cli("search", "x", "--zone", "a", "-k", "0", check=False)
    assert cli.returncode == 2 and cli.stderr.strip() == f"shardfuse search: {error['message']}"
    unknown = http.post("/v1/search", json={"query": "x", "zone": "a", "colour": "red"}, headers=zone_a).json()
    assert unknown["error"]["fields"] == ["colour"] and "unknown search argument(s) 'colour'" in unknown["error"][
        "message"]


def test_over_the_rate_limit_is_429_with_retry_after(api_stack: Stack, http: httpx.Client) -> None:
    key = {"Authorization": f"Bearer {_create_key(api_stack, 'hasty', 'hasty')}"}
    burst = api_stack.settings.api.burst
    started = time.monotonic()
    codes = [http.post("/v1/search", json={}, headers=key).status_code for _ in range(burst + 10)]
    elapsed = time.monotonic() - started
    assert 429 in codes, (codes, elapsed)
    refused = http.post("/v1/search", json={}, headers=key)
    if refused.status_code == 429:  # else the bucket refilled meanwhile (a slow machine): the codes above show it
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["code"] == "rate_limited"
    assert codes[:burst // 2] == [422] * (burst // 2)  # a body without query: refused, and counted


def test_status_and_up_name_the_api(api_stack: Stack) -> None:
    shown = api_stack.cli("status").stdout
    url = api_process.recorded_url(api_stack.settings, api_stack.state)
    assert f"api      {url}" in shown
