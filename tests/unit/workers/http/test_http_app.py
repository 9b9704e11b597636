"""The HTTP API's own rules, with the stores replaced (an in-memory CAS, a list for the broker, a recorded search;
the keys and the rate limit real, in a real redis-server): who may call (401), which zones (403 on every
endpoint), how much (413, 429 with Retry-After), and the JSON errors with the CLI's messages (422 naming the field).
The whole path through a running stack is tests/integration/test_http_api.py."""

from __future__ import annotations

import contextlib
import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from shardfuse.pipeline.admin.api_keys import KeyRing, KeyStore
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.coordination.token_bucket import TokenBucket
from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.pipeline.core.events import WriteEvent
from shardfuse.pipeline.storage.cas import InMemoryContentStore
from shardfuse.query.request import parse_request
from shardfuse.workers.http.app import create_app
from shardfuse.workers.http.services import Services
from tests.support.socket_redis import socket_redis


class RecordedSearches:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def search(self, arguments: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(arguments)
        return {"results": [], "zone": arguments.get("zone")}


class ListedEvents(Services):
    """Services whose broker is a list of the events published."""

    published: list[WriteEvent]

    @contextlib.contextmanager
    def event_sink(self) -> Iterator[Any]:
        held: list[WriteEvent] = []
        sink = type("Sink", (), {"send": lambda _self, event: held.append(event)})()
        yield sink
        self.published.extend(held)

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def redis_socket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with socket_redis(tmp_path_factory.mktemp("redis")) as sock:
        yield sock


@pytest.fixture
def api(tmp_path: Path, redis_socket: Path) -> Iterator[tuple[TestClient, ListedEvents, dict[str, str]]]:
    settings = Settings(data_dir=tmp_path, api={"max_request_bytes": 2048, "max_upload_bytes": 4096,
                                                "rate_per_s": 1.0, "burst": 5})
    client = redis.Redis(unix_socket_path=str(redis_socket))
    client.flushall()
    store = KeyStore(tmp_path / "api-keys.json")
    _, zone_a = store.create(name="a", read=["a"], write=["a"])
    _, admin = store.create(name="admin", read=["*"], write=["*"])
    held = ListedEvents(settings=settings, keys=KeyRing(store=store), searches=RecordedSearches(),  # type: ignore[arg-type]
                        cas=InMemoryContentStore(), broker=client,
                        limiter=TokenBucket(client, name="api", rate_per_s=1.0, burst=5))
    held.published = []
    with TestClient(create_app(settings, build=lambda _: held)) as http:
        yield http, held, {"a": zone_a, "admin": admin}
    client.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_no_key_or_an_unknown_one_is_401(api: tuple[TestClient, ListedEvents, dict[str, str]]) -> None:
    http, _, _ = api
    missing = http.post("/v1/search", json={"query": "x", "zone": "a"})
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "unauthorized"
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = http.get("/v1/status", headers=bearer("sfk_nope_nope"))
    assert wrong.status_code == 401 and wrong.json()["error"]["message"] == "unknown or revoked API key"


def test_a_zone_a_key_gets_403_on_zone_b_everywhere(api: tuple[TestClient, ListedEvents, dict[str, str]]) -> None:
    http, held, tokens = api
    key = bearer(tokens["a"])
    refused = [
        http.post("/v1/search", json={"query": "x", "zone": "b"}, headers=key),
        http.post("/v1/search", json={"query": "x", "zones": ["a", "b"]}, headers=key),
        http.post("/v1/documents", params={"zone": "b", "path": "p.txt"}, content=b"hi", headers=key),
        http.delete("/v1/documents", params={"zone": "b", "path": "p.txt"}, headers=key),
        http.get("/v1/status", params={"zone": "b"}, headers=key),
    ]
    assert [r.status_code for r in refused] == [403] * 5
    assert refused[0].json()["error"] == {"code": "forbidden", "message": "API key 'a' may not read zone 'b'"}
    assert held.published == [] and held.searches.calls == []  # type: ignore[attr-defined]


def test_bad_json_is_422_with_the_cli_message_and_the_field(
        api: tuple[TestClient, ListedEvents, dict[str, str]]) -> None:
    http, held, tokens = api
    answer = http.post("/v1/search", json={"query": "x", "zone": "a", "k": 0}, headers=bearer(tokens["a"]))
    assert answer.status_code == 422
    with pytest.raises(InvalidQueryError) as cli_error:  # what `shardfuse search -k 0` prints after its name
        parse_request({"query": "x", "zone": "a", "k": 0}, settings=held.settings.query)
    assert answer.json()["error"] == {"code": "invalid_request", "message": str(cli_error.value), "fields": ["k"]}
    not_json = http.post("/v1/search", content=b"{nope", headers=bearer(tokens["a"]))
    assert not_json.status_code == 422
    assert not_json.json()["error"]["code"] == "invalid_json" and not_json.json()["error"]["fields"] == ["body"]


def test_a_query_parameter_that_is_not_utf8_is_422_and_never_replaced(
        api: tuple[TestClient, ListedEvents, dict[str, str]]) -> None:
    # Starlette would read caf%E9 (Latin-1) and caf%E8 alike as "caf\ufffd": two names, one published path.
    http, held, tokens = api
    key = bearer(tokens["admin"])
    for url in ("/v1/documents?zone=a&path=caf%E9.txt", "/v1/documents?zone=a&path=%ED%A0%80.txt",
                "/v1/documents?zone=a&path=ok.txt&metadata=%7B%22k%22%3A%22%FF%22%7D"):
        refused = http.post(url, headers=key, content=b"hello")
        assert refused.status_code == 422, url
        error = refused.json()["error"]
        assert error["code"] == "invalid_request" and "not UTF-8 once percent-decoded" in error["message"]
        assert error["fields"] == [url.rsplit("&", 1)[1].split("=")[0]]
    assert http.delete("/v1/documents?zone=a&path=caf%E9.txt", headers=key).status_code == 422
    assert held.published == []
    accepted = [http.post(f"/v1/documents?zone=a&path={path}", headers=key, content=b"hello")
                for path in ("caf%C3%A9.txt", "%EF%BF%BD.txt", "a+b.txt")]  # UTF-8, U+FFFD itself, a space
    assert [r.status_code for r in accepted] == [202] * 3
    assert [event.path for event in held.published] == ["café.txt", "\ufffd.txt", "a b.txt"]


def test_a_document_parameter_given_twice_is_422_not_the_last_one(
        api: tuple[TestClient, ListedEvents, dict[str, str]]) -> None:
    # FastAPI takes the last of a repeated parameter: ?path=a.md&path=b.md published b.md alone.
    http, held, tokens = api
    key = bearer(tokens["admin"])
    for method, url, field in (("POST", "/v1/documents?zone=a&path=a.md&path=b.md", "path"),
                               ("POST", "/v1/documents?zone=a&zone=b&path=a.md", "zone"),
                               ("POST", "/v1/documents?zone=a&path=a.md&metadata=%7B%7D&metadata=%7B%7D", "metadata"),
                               ("DELETE", "/v1/documents?zone=a&path=a.md&path=b.md", "path")):
        refused = http.request(method, url, headers=key, content=b"x" if method == "POST" else None)
        assert refused.status_code == 422, url
        assert refused.json()["error"] == {"code": "invalid_request", "fields": [field], "message": (
            f"query parameter '{field}' is given 2 times: give it once (one document a request)")}
    assert held.published == []


def test_a_compressed_body_is_415_and_nothing_is_published(
        api: tuple[TestClient, ListedEvents, dict[str, str]]) -> None:
    # Bodies are read as they arrive: a gzip upload was published as its compressed bytes (then skipped as
    # binary), and gzip JSON failed as "not JSON: 'utf-8' codec can't decode byte 0x8b".
    http, held, tokens = api
    key = bearer(tokens["admin"])
    gzipped = {**key, "Content-Encoding": "gzip"}
    upload = http.post("/v1/documents", params={"zone": "a", "path": "notes.txt"}, headers=gzipped,
                       content=gzip.compress(b"hello"))
    assert upload.status_code == 415
    assert upload.json()["error"] == {"code": "unsupported_media_type", "message": "Content-Encoding 'gzip' is not "
                                      "accepted: send the body uncompressed; nothing was published"}
    search = http.post("/v1/search", headers=gzipped, content=gzip.compress(b'{"query": "x", "zone": "a"}'))
    assert search.status_code == 415 and held.published == []
    plain = http.post("/v1/documents", params={"zone": "a", "path": "notes.txt"}, content=b"hello",
                      headers={**key, "Content-Encoding": "identity"})
    assert plain.status_code == 202 and held.cas.get(held.published[0].content_hash or "") == b"hello"


def test_json_nested_too_deeply_is_422_not_an_internal_error(
        api: tuple[TestClient, ListedEvents, dict[str, str]]) -> None:
    # Python's json decoder recurses once per level: a few kilobytes of brackets used to end in a 500.
    http, held, tokens = api
    key = bearer(tokens["admin"])
    deep = http.post("/v1/search", content=b"[" * 1_020 + b"]" * 1_020, headers=key)  # within the 2,048 bytes
    assert deep.status_code == 422
    assert deep.json()["error"] == {"code": "invalid_json", "fields": ["body"],
                                    "message": "the request body nests deeper than 64 levels (1020 or more)"}
    metadata = '{"a":' * 2_000 + "1" + "}" * 2_000
    upload = http.post("/v1/documents", params={"zone": "a", "path": "deep.txt", "metadata": metadata},
                       headers=key, content=b"hello")
    assert upload.status_code == 422 and upload.json()["error"]["fields"] == ["metadata"]
    assert "nests deeper than 64 levels" in upload.json()["error"]["message"]
    assert held.published == []


def test_oversize_bodies_are_413_and_nothing_is_published(
        api: tuple[TestClient, ListedEvents, dict[str, str]]) -> None:
    http, held, tokens = api
    key = bearer(tokens["admin"])
    big = http.post("/v1/search", json={"query": "x" * 3000, "zone": "a"}, headers=key)
    assert big.status_code == 413 and "api.max_request_bytes" in big.json()["error"]["message"]
    upload = http.post("/v1/documents", params={"zone": "a", "path": "big.txt"}, headers=key,
                       content=iter([b"x" * 1000] * 5))  # chunked: no Content-Length to refuse it by
    assert upload.status_code == 413 and "nothing was published" in upload.json()["error"]["message"]
    assert held.published == []
    ok = http.post("/v1/documents", params={"zone": "a", "path": "small.txt", "metadata": '{"team": "x"}'},
                   headers=key, content=b"hello")
    assert ok.status_code == 202
    event = held.published[0]
    assert ok.json() == {"event_id": event.event_id, "op": "write", "zone": "a", "path": "small.txt",
                         "seq": event.seq, "content_hash": event.content_hash, "size": 5}
    assert held.cas.get(event.content_hash or "") == b"hello" and event.metadata == {"team": "x"}
    assert event.mime == "text/plain"


def test_over_the_rate_limit_is_429_with_retry_after(api: tuple[TestClient, ListedEvents, dict[str, str]]) -> None:
    http, _, tokens = api
    codes = [http.get("/v1/status", params={"zone": "nope/"}, headers=bearer(tokens["a"])).status_code
             for _ in range(6)]
    assert codes == [422] * 5 + [429]  # bad requests spend tokens too
    refused = http.get("/healthz")
    assert refused.status_code == 200  # the probes need no key and no token
    limited = http.get("/v1/status", headers=bearer(tokens["a"]))
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    other = http.post("/v1/search", json={"query": "x", "zone": "a"}, headers=bearer(tokens["admin"]))
    assert other.status_code == 200  # each key has a bucket of its own


def test_an_upload_naming_a_bad_path_is_refused_before_reading(
        api: tuple[TestClient, ListedEvents, dict[str, str]]) -> None:
    http, held, tokens = api
    answer = http.post("/v1/documents", params={"zone": "a", "path": "bad\x00path"}, content=b"x",
                       headers=bearer(tokens["a"]))
    assert answer.status_code == 422 and answer.json()["error"]["message"].startswith("invalid write event: path")
    assert held.published == []
