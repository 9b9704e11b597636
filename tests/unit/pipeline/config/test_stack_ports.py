"""Which ports of the embedded stack shardfuse may choose, and the choice every later command resolves."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardfuse.pipeline.config.settings import Settings, load_settings
from shardfuse.pipeline.config.stack_ports import (
    PortSlot,
    apply_stack_ports,
    chosen_ports,
    load_stack_ports,
    ports_file,
    save_stack_ports,
)
from shardfuse.pipeline.core.errors import ConfigurationError

DEFAULTS = {PortSlot.REDIS: 16379, PortSlot.POSTGRES: 15432, PortSlot.FLOWER: 15555, PortSlot.API: 15560,
            PortSlot.METRICS: 15556}


# No SHARDFUSE_* variable of the shell running the tests, and a HOME of its own (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("isolated_settings_env")


def test_every_port_left_at_its_default_is_the_stacks_to_choose() -> None:
    assert chosen_ports(Settings(), recorded={}) == DEFAULTS


def test_a_port_the_user_set_is_not() -> None:
    settings = Settings.model_validate({
        "broker": {"url": "redis://127.0.0.1:7000/0"}, "postgres": {"dsn": "postgresql://me@127.0.0.1:5433/x"},
        "stack": {"flower_port": 9000, "api_port": 0, "metrics_port": 9100},
    })  # fmt: skip
    assert chosen_ports(settings, recorded={}) == {}
    # The default URL on another host, or with another database, is the user's too.
    other = Settings.model_validate({"broker": {"url": "redis://127.0.0.1:16379/3"},
                                     "postgres": {"dsn": "postgresql://postgres@127.0.0.1:15432/mine"}})
    assert PortSlot.REDIS not in chosen_ports(other, recorded={})
    assert PortSlot.POSTGRES not in chosen_ports(other, recorded={})
    sharded = Settings.model_validate({"shards": 1, "postgres": {"shard_dsns": ["postgresql://postgres@127.0.0.1:15432/a"]}})
    assert PortSlot.POSTGRES not in chosen_ports(sharded, recorded={})


def test_moving_keeps_passwords_and_the_rest_of_each_address() -> None:
    settings = Settings.model_validate({
        "broker": {"url": "redis://:s3cret@127.0.0.1:16379/0", "result_backend": "redis://:s3cret@127.0.0.1:16379/1"},
        "postgres": {"dsn": "postgresql://postgres:pw@127.0.0.1:15432/shardfuse"},
    })  # fmt: skip
    assert chosen_ports(settings, recorded={}) == DEFAULTS  # a password is no choice of port
    moved = apply_stack_ports(settings, {PortSlot.REDIS: 16400, PortSlot.POSTGRES: 15440, PortSlot.FLOWER: 15600,
                                         PortSlot.API: 15601, PortSlot.METRICS: 15602}, recorded={})
    assert moved.broker.url == "redis://:s3cret@127.0.0.1:16400/0"
    assert moved.broker.result_backend == "redis://:s3cret@127.0.0.1:16400/1"
    assert moved.postgres.dsn == "postgresql://postgres:pw@127.0.0.1:15440/shardfuse"
    assert (moved.stack.flower_port, moved.stack.api_port, moved.stack.metrics_port) == (15600, 15601, 15602)
    # Once moved, the recorded port counts as "left alone" too: the next move starts from there.
    assert chosen_ports(moved, recorded={PortSlot.REDIS: 16400})[PortSlot.REDIS] == 16400


def test_a_result_backend_the_user_set_stays_where_it_is() -> None:
    settings = Settings.model_validate({"broker": {"result_backend": "redis://127.0.0.1:7001/1"}})
    moved = apply_stack_ports(settings, {PortSlot.REDIS: 16400}, recorded={})
    assert (moved.broker.url, moved.broker.result_backend) == ("redis://127.0.0.1:16400/0", "redis://127.0.0.1:7001/1")


def test_every_command_of_a_data_dir_resolves_the_recorded_ports(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    save_stack_ports(tmp_path, {PortSlot.REDIS: 16401, PortSlot.POSTGRES: 15441, PortSlot.FLOWER: 15601,
                                PortSlot.API: 15602, PortSlot.METRICS: 15603})
    assert ports_file(tmp_path).stat().st_mode & 0o777 == 0o644  # addresses only, no secrets
    settings = load_settings(data_dir=tmp_path)
    assert settings.broker.url == "redis://127.0.0.1:16401/0"
    assert settings.broker.result_backend == "redis://127.0.0.1:16401/1"
    assert settings.postgres.dsn == "postgresql://postgres@127.0.0.1:15441/shardfuse"
    assert (settings.stack.flower_port, settings.stack.api_port, settings.stack.metrics_port) == (15601, 15602, 15603)
    # A port the user sets wins over the recorded one.
    monkeypatch.setenv("SHARDFUSE_STACK__FLOWER_PORT", "9000")
    assert load_settings(data_dir=tmp_path).stack.flower_port == 9000
    # Another data dir has its own (here: none recorded, the defaults).
    assert load_settings(data_dir=tmp_path / "other").stack.api_port == 15560


def test_a_damaged_ports_file_is_a_clear_error(tmp_path: Path) -> None:
    ports_file(tmp_path).write_text('{"version": 1, "ports": {"redis": "many"}}')
    with pytest.raises(ConfigurationError, match=r"the stack's ports in .*stack-ports.json are damaged"):
        load_stack_ports(tmp_path)
    ports_file(tmp_path).write_text('{"version": 1, "ports": {"teapot": 1}}')
    with pytest.raises(ConfigurationError, match="delete the file and run `shardfuse up`"):
        load_settings(data_dir=tmp_path)
