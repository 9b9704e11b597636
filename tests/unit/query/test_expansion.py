"""LLM query expansion, through the real ``openai`` client against a local OpenAI-compatible server."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
from pydantic import SecretStr

from shardfuse.pipeline.config.settings import ExpansionSettings
from shardfuse.query.expansion import cache as expansion_cache_module
from shardfuse.query.expansion import expander as expansion_module
from shardfuse.query.expansion.expander import (
    MAX_PASSAGE_CHARS,
    MAX_VARIANT_CHARS,
    Expansion,
    QueryExpander,
    RedisExpansionCache,
    build_messages,
    cache_key,
    keyword_leg_is_decisive,
    parse_expansion,
)
from tests.support.openai_server import CHAT_COMPLETIONS, FakeOpenAIServer, Reply

QUERY = "replace chunks atomically"
PREFIX = "shardfuse:expansion:"


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as running:
        yield running


def make_settings(server: FakeOpenAIServer, **overrides: Any) -> ExpansionSettings:
    values: dict[str, Any] = {
        "enabled": True,
        "base_url": server.base_url,
        "api_key": SecretStr("sk-test"),
        "model": "test-model",
        "timeout_s": 2.0,
        "max_variants": 3,
    }
    return ExpansionSettings(**{**values, **overrides})


@pytest.fixture
def make_expander(server: FakeOpenAIServer) -> Iterator[Any]:
    """Expanders that build their own SDK client from the settings, as in production; closed afterwards."""
    built: list[QueryExpander] = []

    def make(*, cache: Any = None, **overrides: Any) -> QueryExpander:
        expander = QueryExpander(settings=make_settings(server, **overrides), cache=cache)
        built.append(expander)
        return expander

    yield make
    for expander in built:
        expander.close()


def reply_json(**fields: Any) -> Reply:
    return Reply.chat(json.dumps(fields))


GOOD = {"lexical": ["swap chunks", "atomic_replace"], "questions": ["How are old chunks replaced?"], "passage": "P."}


# -- through the client ----------------------------------------------------------------------------------
def test_a_model_reply_is_parsed_and_capped_and_the_request_is_well_formed(
    server: FakeOpenAIServer, make_expander: Any
) -> None:
    server.script(
        CHAT_COMPLETIONS,
        [
            reply_json(
                lexical=["swap chunks", QUERY.upper(), "swap  chunks", 7, "", "atomic_replace", "x" * 500, "extra"],
                questions=["How are old chunks replaced?", None],
                passage="p" * 5000,
            )
        ],
    )
    outcome = make_expander().expand(QUERY)

    assert outcome.source == "model" and outcome.reason is None and outcome.ms > 0
    assert outcome.expansion is not None
    assert outcome.expansion.lexical == ("swap chunks", "atomic_replace", "x" * MAX_VARIANT_CHARS)
    assert outcome.expansion.questions == ("How are old chunks replaced?",)
    assert outcome.expansion.passage == "p" * MAX_PASSAGE_CHARS
    [request] = server.requests(CHAT_COMPLETIONS)
    assert request.bearer == "sk-test"
    assert request.json["model"] == "test-model"
    assert request.json["temperature"] == 0
    assert request.json["response_format"] == {"type": "json_object"}
    assert request.json["messages"][-1] == {"role": "user", "content": QUERY}


def test_a_cached_expansion_does_not_reach_the_server(server: FakeOpenAIServer, make_expander: Any) -> None:
    redis = fakeredis.FakeRedis()
    expander = make_expander(cache=RedisExpansionCache(redis), cache_ttl_s=600)
    server.script(CHAT_COMPLETIONS, [reply_json(**GOOD)])

    first, second = expander.expand(QUERY), expander.expand(f"  {QUERY} ")

    assert (first.source, second.source) == ("model", "cache")
    assert second.expansion == first.expansion == Expansion.from_dict(GOOD)
    assert len(server.requests()) == 1
    key = PREFIX + cache_key(QUERY, model="test-model", max_variants=3)
    assert redis.keys(PREFIX + "*") == [key.encode()]
    assert 590 <= redis.ttl(key) <= 600


def test_a_zero_ttl_switches_the_cache_off(server: FakeOpenAIServer, make_expander: Any) -> None:
    redis = fakeredis.FakeRedis()
    expander = make_expander(cache=RedisExpansionCache(redis), cache_ttl_s=0)
    server.script(CHAT_COMPLETIONS, [reply_json(**GOOD), reply_json(**GOOD)])
    assert [expander.expand(QUERY).source for _ in range(2)] == ["model", "model"]
    assert redis.keys() == []


def test_a_redis_outage_costs_only_the_cache(server: FakeOpenAIServer, make_expander: Any) -> None:
    down = fakeredis.FakeServer()
    down.connected = False
    expander = make_expander(cache=RedisExpansionCache(fakeredis.FakeRedis(server=down)))
    server.script(CHAT_COMPLETIONS, [reply_json(**GOOD)])
    outcome = expander.expand(QUERY)
    assert outcome.source == "model" and outcome.expansion == Expansion.from_dict(GOOD)


def test_a_corrupt_cache_entry_is_ignored(server: FakeOpenAIServer, make_expander: Any) -> None:
    redis = fakeredis.FakeRedis()
    redis.set(PREFIX + cache_key(QUERY, model="test-model", max_variants=3), b'{"lexical": "not a list"}')
    server.script(CHAT_COMPLETIONS, [reply_json(**GOOD)])
    outcome = make_expander(cache=RedisExpansionCache(redis)).expand(QUERY)
    assert outcome.source == "model" and outcome.expansion == Expansion.from_dict(GOOD)


def test_a_rate_limit_with_retry_after_is_retried_once(server: FakeOpenAIServer, make_expander: Any) -> None:
    server.script(CHAT_COMPLETIONS, [Reply(status=429, headers={"Retry-After": "0"}), reply_json(**GOOD)])
    outcome = make_expander().expand(QUERY)
    assert outcome.source == "model" and outcome.expansion == Expansion.from_dict(GOOD)
    assert len(server.requests()) == 2


def test_a_wait_the_server_names_is_honoured_within_the_budget(server: FakeOpenAIServer, make_expander: Any) -> None:
    server.script(CHAT_COMPLETIONS, [Reply(status=503, headers={"Retry-After": "0.3"}), reply_json(**GOOD)])
    started = time.perf_counter()
    outcome = make_expander(timeout_s=2.0).expand(QUERY)
    assert time.perf_counter() - started >= 0.3
    assert outcome.source == "model" and len(server.requests()) == 2


def test_a_persistent_server_error_fails_quickly(server: FakeOpenAIServer, make_expander: Any) -> None:
    server.route(CHAT_COMPLETIONS, lambda _: Reply(status=500))
    started = time.perf_counter()
    outcome = make_expander(timeout_s=5.0).expand(QUERY)
    assert time.perf_counter() - started < 1.5
    assert outcome.source == "failed" and outcome.expansion is None
    assert outcome.reason is not None and "HTTP 500" in outcome.reason and "test-model" in outcome.reason
    assert len(server.requests()) == 2  # one retry, no more


def test_a_retry_after_beyond_the_budget_is_not_waited_for(server: FakeOpenAIServer, make_expander: Any) -> None:
    server.script(CHAT_COMPLETIONS, [Reply(status=429, headers={"Retry-After": "30"}), reply_json(**GOOD)])
    started = time.perf_counter()
    outcome = make_expander(timeout_s=1.0).expand(QUERY)
    assert time.perf_counter() - started < 1.0
    assert outcome.source == "failed" and outcome.reason is not None and "HTTP 429" in outcome.reason
    assert len(server.requests()) == 1


def test_a_client_error_is_not_retried(server: FakeOpenAIServer, make_expander: Any) -> None:
    server.script(CHAT_COMPLETIONS, [Reply(status=401), reply_json(**GOOD)])
    outcome = make_expander().expand(QUERY)
    assert outcome.source == "failed" and outcome.reason is not None
    assert "HTTP 401" in outcome.reason and "SHARDFUSE_QUERY__EXPANSION__API_KEY" in outcome.reason
    assert len(server.requests()) == 1


def test_a_slow_model_is_abandoned_within_the_time_budget(server: FakeOpenAIServer, make_expander: Any) -> None:
    timeout_s = 0.5
    server.route(CHAT_COMPLETIONS, lambda _: Reply.chat(json.dumps(GOOD), delay_s=5.0))
    started = time.perf_counter()
    outcome = make_expander(timeout_s=timeout_s).expand(QUERY)
    elapsed = time.perf_counter() - started
    assert outcome.source == "failed" and outcome.reason is not None and "timed out" in outcome.reason
    assert elapsed < timeout_s + 2.0  # generous: this checks the budget holds, not its precision


def test_an_unreachable_server_fails_the_expansion_not_the_search() -> None:
    with FakeOpenAIServer() as gone:
        url = gone.base_url
    expander = QueryExpander(settings=make_settings(gone).model_copy(update={"base_url": url}))
    started = time.perf_counter()
    outcome = expander.expand(QUERY)
    expander.close()
    assert outcome.source == "failed" and outcome.reason is not None and "could not be reached" in outcome.reason
    assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize(
    "reply",
    [
        Reply.chat("I think you mean atomic swaps!"),
        Reply.chat("[1, 2, 3]"),
        Reply.chat('{"answer": "unrelated"}'),
        Reply.chat(None),
        Reply(status=200, body=b"<html>not json</html>", headers={"Content-Type": "text/html"}),
        # Nested past what Python's json decoder recurses through, in the reply or in the whole response.
        Reply.chat('{"lexical": ' + "[" * 5_000 + "]" * 5_000 + "}"),
        Reply(status=200, body=b"[" * 50_000 + b"]" * 50_000, headers={"Content-Type": "application/json"}),
    ],
    ids=["prose", "json-list", "wrong-keys", "no-content", "not-json-http", "deep-json-reply", "deep-json-http"],
)
def test_unusable_output_fails(server: FakeOpenAIServer, make_expander: Any, reply: Reply) -> None:
    server.script(CHAT_COMPLETIONS, [reply])
    outcome = make_expander().expand(QUERY)
    assert outcome.source == "failed" and outcome.expansion is None and outcome.reason


def test_a_decisive_keyword_leg_skips_the_model(server: FakeOpenAIServer, make_expander: Any) -> None:
    expander = make_expander(skip_min_top_score=8.0, skip_min_gap_ratio=0.25)
    outcome = expander.expand(QUERY, keyword_scores=[12.0, 6.0, 1.0])
    assert (outcome.source, outcome.expansion, outcome.reason) == ("skipped", None, "the keyword leg is decisive")
    assert server.requests() == []
    server.script(CHAT_COMPLETIONS, [reply_json(**GOOD)])
    assert expander.expand(QUERY, keyword_scores=[12.0, 11.0]).source == "model"


def test_disabled_or_empty_queries_are_skipped(server: FakeOpenAIServer, make_expander: Any) -> None:
    assert make_expander(enabled=False).expand(QUERY).source == "skipped"
    assert make_expander().expand("   ").source == "skipped"
    assert server.requests() == []


def test_an_unset_api_key_still_sends_a_placeholder(server: FakeOpenAIServer, make_expander: Any) -> None:
    server.script(CHAT_COMPLETIONS, [reply_json(**GOOD)])
    assert make_expander(api_key=SecretStr("")).expand(QUERY).source == "model"
    assert server.requests()[0].bearer == "unset"


# -- pure logic ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("scores", "decisive"),
    [
        ([], False),
        ([9.0], True),  # a single hit counts as separated
        ([7.9], False),  # below min_top
        ([10.0, 7.5], True),  # gap ratio exactly 0.25
        ([10.0, 7.6], False),
        ([7.5, 10.0, 1.0], True),  # order does not matter
        ([0.0], False),
    ],
)
def test_keyword_leg_is_decisive(scores: list[float], decisive: bool) -> None:
    assert keyword_leg_is_decisive(scores, min_top=8.0, min_gap_ratio=0.25) is decisive


def test_keyword_leg_with_no_threshold_never_divides_by_zero() -> None:
    assert keyword_leg_is_decisive([0.0, 0.0], min_top=0.0, min_gap_ratio=0.0) is False


def test_parse_expansion_tolerates_code_fences_and_prose() -> None:
    body = json.dumps(GOOD)
    for text in (f"```json\n{body}\n```", f"```\n{body}```", f"Here you go:\n{body}\nEnjoy.", body):
        assert parse_expansion(text, query=QUERY, max_variants=3) == Expansion.from_dict(GOOD)


def test_parse_expansion_drops_bad_entries() -> None:
    text = json.dumps(
        {
            "lexical": ["a", "A", " a ", 1, None, ["b"], "", "  ", QUERY, "b", "c", "d"],
            "questions": "not a list",
            "passage": {"text": "wrong type"},
        }
    )
    assert parse_expansion(text, query=QUERY, max_variants=3) == Expansion(lexical=("a", "b", "c"))
    assert parse_expansion(json.dumps({"passage": f" {QUERY} "}), query=QUERY, max_variants=3).passage is None
    assert parse_expansion(json.dumps({"lexical": ["a"]}), query=QUERY, max_variants=0).is_empty


@pytest.mark.parametrize("text", ["", "nope", "[]", "{not json}", '{"other": 1}', "```json\n```",
                                  '{"lexical": ' + "[" * 5_000 + "]" * 5_000 + "}"])
def test_parse_expansion_rejects_what_is_not_an_expansion(text: str) -> None:
    with pytest.raises(ValueError):
        parse_expansion(text, query=QUERY, max_variants=3)


def test_expansion_round_trips_and_rejects_corrupt_dicts() -> None:
    expansion = Expansion(lexical=("a",), questions=("b?",), passage="c")
    assert Expansion.from_dict(json.loads(json.dumps(expansion.to_dict()))) == expansion
    assert Expansion.from_dict({}) == Expansion()
    for bad in ({"lexical": "a"}, {"questions": [1]}, {"passage": 3}):
        with pytest.raises(ValueError):
            Expansion.from_dict(bad)


def test_cache_key_covers_everything_that_shapes_an_expansion(monkeypatch: pytest.MonkeyPatch) -> None:
    key = cache_key(QUERY, model="m", max_variants=3)
    assert key == cache_key(f" {QUERY}  ", model="m", max_variants=3)
    others = [
        cache_key("other", model="m", max_variants=3),
        cache_key(QUERY, model="n", max_variants=3),
        cache_key(QUERY, model="m", max_variants=2),
    ]
    assert len({key, *others}) == 4
    # The key reads the version where the cache lives.
    monkeypatch.setattr(expansion_cache_module, "PROMPT_VERSION", expansion_module.PROMPT_VERSION + 1)
    assert cache_key(QUERY, model="m", max_variants=3) != key


def test_build_messages_asks_for_json_with_the_variant_limit() -> None:
    system, user = build_messages(QUERY, max_variants=5)
    assert system["role"] == "system" and "JSON" in str(system["content"]) and "up to 5" in str(system["content"])
    assert user == {"role": "user", "content": QUERY}
