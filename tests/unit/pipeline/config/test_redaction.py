"""Secrets stay out of reprs, printed URLs and recorded state; the embedded servers get passwords safely."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from shardfuse.pipeline.config.redaction import (
    MASK,
    dsn_password,
    redact_dsn,
    redact_text,
    redact_url,
    secret_values,
    url_password,
)
from shardfuse.pipeline.config.settings import Settings, load_settings
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.workers.stack import access, postgres_server, redis_server
from shardfuse.workers.stack.addresses import StackAddresses
from shardfuse.workers.stack.errors import StackError
from shardfuse.workers.stack.launcher import _current_state
from shardfuse.workers.stack.layout import StackLayout

REDIS_PW = "Rd#7q!zx SECRET;x"
PG_PW = "Pg@9w/SECRET'x"


def _secret_settings(**extra: object) -> Settings:
    redis_pw = quote(REDIS_PW, safe="")
    return Settings.model_validate({
        "broker": {"url": f"redis://:{redis_pw}@127.0.0.1:16379/0",
                   "result_backend": f"redis://:{redis_pw}@127.0.0.1:16379/1"},
        "postgres": {"dsn": f"postgresql://postgres:{quote(PG_PW, safe='')}@127.0.0.1:15432/sf",
                     "shard_dsns": ["host=127.0.0.1 port=15432 dbname=s0 user=u password=ShardPw0",
                                    "postgresql://u:ShardPw1@127.0.0.1:15432/s1"]},
        "shards": 2,
        "embedder": {"api_key": "sk-embedder-SECRET"},
        "context": {"api_key": "sk-context-SECRET"},
        "query": {"expansion": {"api_key": "sk-expansion-SECRET"}},
        "rerank": {"api_key": "sk-rerank-SECRET"},
        "flower": {"password": "flower-SECRET"},
        "cas": {"url": "s3://cas-bucket", "s3": {"access_key_id": "AKID", "secret_access_key": "s3-SECRET"}},
        **extra,
    })


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://default:p%40ss@h:1/0", "redis://default:***@h:1/0"),
        ("redis://:p@ss:w@h:1/0", "redis://:***@h:1/0"),  # unencoded '@' and ':' in the password
        ("redis://:ab#cd@h:1/0", "redis://:***@h:1/0"),
        ("redis://:a;b@h/0;redis://:c@h2/0", "redis://:***@h/0;redis://:***@h2/0"),  # kombu failover list
        ("postgresql://postgres:Pg%40x@127.0.0.1:5/db", "postgresql://postgres:***@127.0.0.1:5/db"),
        ("postgresql://u@h/db?sslmode=require&password=zz", "postgresql://u@h/db?sslmode=require&password=***"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
    ],
)
def test_urls_are_shown_with_their_password_masked(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_key_value_dsns_are_masked_and_passwords_are_read_decoded() -> None:
    masked = redact_dsn("host=h user=u password='a b' dbname=d")
    assert "a b" not in masked and f"password={MASK}" in masked and "host=h" in masked
    assert redact_dsn("host=h user=u") == "host=h user=u"
    assert redact_dsn("host='unterminated password=x") == "<unparseable connection string>"
    assert dsn_password("postgresql://postgres:Pg%40x@h/db") == "Pg@x"
    assert dsn_password("host=h password=xx") == "xx" and dsn_password("host=h") is None
    assert url_password("redis://:p%23w@h:1/0") == "p#w" and url_password("redis://h:1/0") is None


def test_secret_values_lists_every_secret_of_the_settings() -> None:
    assert set(secret_values(_secret_settings())) == {
        REDIS_PW, PG_PW, "ShardPw0", "ShardPw1", "sk-embedder-SECRET", "sk-context-SECRET",
        "sk-expansion-SECRET", "sk-rerank-SECRET", "flower-SECRET", "s3-SECRET",
    }  # fmt: skip
    assert secret_values(Settings.model_validate({"flower": {"password": ""}})) == []


def test_redact_text_masks_plain_and_url_encoded_spellings() -> None:
    text = f"connecting to redis://:{quote(REDIS_PW, safe='')}@h/0 with {REDIS_PW} and {PG_PW}"
    clean = redact_text(text, [REDIS_PW, PG_PW])
    assert REDIS_PW not in clean and quote(REDIS_PW, safe="") not in clean and PG_PW not in clean
    assert clean.count(MASK) == 3


def test_repr_and_str_of_the_settings_hold_no_secret() -> None:
    settings = _secret_settings()
    for shown in (repr(settings), str(settings), repr(settings.broker), repr(settings.postgres)):
        for secret in secret_values(settings):
            for spelling in (secret, quote(secret, safe="")):
                assert spelling not in shown
    assert "redis://:***@127.0.0.1:16379/0" in repr(settings)
    assert settings.broker.display_url == "redis://:***@127.0.0.1:16379/0"
    assert settings.broker.url.startswith("redis://:Rd%23")  # the value itself is untouched


def test_the_recorded_stack_state_holds_no_password(tmp_path: Path) -> None:
    settings = _secret_settings(data_dir=tmp_path)
    state = _current_state(settings, addresses=StackAddresses.from_settings(settings), layout=StackLayout(tmp_path))
    assert state.broker_url == "redis://:***@127.0.0.1:16379/0"
    assert state.postgres_dsn == "postgresql://postgres:***@127.0.0.1:15432/sf"


def test_the_redis_password_goes_on_stdin_escaped_never_on_the_command_line(tmp_path: Path) -> None:
    settings = _secret_settings(data_dir=tmp_path)
    password = redis_server.broker_password(settings.broker.url)
    assert password == REDIS_PW
    text = redis_server.config_text(password)
    assert re.fullmatch(r'requirepass "(?:[A-Za-z0-9]|\\x[0-9a-f]{2})+"\n', text)
    escaped = text.split('"')[1]
    decoded = re.sub(r"\\x([0-9a-f]{2})", lambda m: chr(int(m[1], 16)), escaped).encode("latin-1").decode()
    assert decoded == REDIS_PW
    assert redis_server.config_text(None) == ""
    command = redis_server.redis_command(Path("/bin/redis-server"), endpoint=StackAddresses.from_settings(
        settings).redis, layout=StackLayout(tmp_path))  # fmt: skip
    assert not any(REDIS_PW in arg or "requirepass" in arg for arg in command)
    with pytest.raises(StackError, match="only the default"):
        redis_server.broker_password("redis://someone:pw@127.0.0.1:1/0")
    assert redis_server.broker_password("redis://default:pw@127.0.0.1:1/0") == "pw"


def test_postgres_requires_scram_over_tcp_and_trusts_no_one(tmp_path: Path) -> None:
    target = StackAddresses.from_settings(_secret_settings()).postgres
    rules = [line.split() for line in access.hba_conf().splitlines() if line.startswith(("host", "local"))]
    assert [rule[-1] for rule in rules if rule[0] == "host"] == ["scram-sha-256", "scram-sha-256"]
    assert [rule[-2:] for rule in rules if rule[0] == "local"] == [["peer", f"map={access.IDENT_MAP}"]]
    assert not any("trust" in rule for rule in rules)
    # Only the OS users named may use the socket, and only as the superuser.
    ident = [line.split() for line in access.ident_conf(superuser="postgres", os_users=("alice", "pgserver", "alice"))
             .splitlines() if not line.startswith("#")]  # fmt: skip
    assert ident == [[access.IDENT_MAP, "alice", "postgres"], [access.IDENT_MAP, "pgserver", "postgres"]]
    conf = postgres_server.server_conf(target, socket_dir=tmp_path)
    assert "unix_socket_permissions = 0700" in conf and "scram-sha-256" in conf
    assert PG_PW not in conf
    assert postgres_server.dsn_password(_secret_settings().postgres.dsn) == PG_PW


def test_a_data_dir_that_trusted_loopback_is_recognised(tmp_path: Path) -> None:
    assert not access.hba_trusts(tmp_path)  # no pg_hba.conf yet
    (tmp_path / access.HBA_CONF).write_text("# a comment that says trust\nlocal all all trust\n"
                                            "host all all 127.0.0.0/8 trust\n")
    assert access.hba_trusts(tmp_path)
    (tmp_path / access.HBA_CONF).write_text(access.hba_conf())
    assert not access.hba_trusts(tmp_path)


@pytest.mark.parametrize(("overrides", "names"), [
    ({"cas": {"url": "s3://bucket/p", "s3": {"secret_access_key": "topsecret-value-1"}}}, "cas.s3"),
    ({"broker": {"url": "redis://:topsecret-value-1@127.0.0.1:notaport/0"}}, "broker.url"),
    ({"broker": {"result_backend": "redis://:topsecret-value-1@127.0.0.1:99999/1"}}, "broker.result_backend"),
    ({"embedder": {"api_key": "topsecret-value-1", "batch_size": "many"}}, "embedder.batch_size"),
])
def test_invalid_settings_are_named_one_line_each_without_the_values_given(overrides: dict[str, Any],
                                                                            names: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(**overrides)
    message = str(caught.value)
    assert message.startswith(f"invalid settings: {names}: ") and "\n" not in message, message
    assert "topsecret-value-1" not in message and "errors.pydantic.dev" not in message


def test_a_broker_url_whose_port_is_no_port_is_refused_at_load_masked() -> None:
    with pytest.raises(ConfigurationError, match=re.escape("broker.url: redis://:***@host:99999/0: Port out of range")):
        load_settings(broker={"url": "redis://:pw@host:99999/0"})
    assert Settings(broker={"url": "redis://:pw@host:6380/0;redis://:pw@other:6381/0"}).broker.url.endswith("/0")
