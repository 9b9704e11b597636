"""kombu's private API under our Redis transport, as recorded for the pinned versions.

:mod:`shardfuse.workers.broker.transport` overrides private methods of kombu's Redis transport and calls
others; :mod:`shardfuse.workers.monitor` and :mod:`shardfuse.workers.broker.redelivery` read kombu's Redis key
layout directly. None of that is kombu's public API, so a kombu release may change it without notice: the
transport would still import, and lose or duplicate messages at run time. pyproject.toml pins celery, kombu
and redis exactly; these tests fail, naming what to re-check, when the installed versions differ from the pins
or when any recorded signature or source differs.

After a deliberate bump: port the overrides to each change named here, run
tests/integration/test_broker_inbox.py and ``make test-faults``, then record the new values
(``python -m tests.unit.workers.test_kombu_private_api`` prints them) and ``RECORDED_FOR``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import inspect
import tomllib
from collections.abc import Callable
from typing import Any

import pytest
from packaging.requirements import Requirement

from tests.support.paths import REPO

# The versions the values below were recorded from.
RECORDED_FOR = {"celery": "5.7.0", "kombu": "5.7.0", "redis": "8.1.0"}

# What each recorded object is to us: what to re-read in our code when it changes.
OVERRIDE = "overridden by shardfuse.workers.broker.transport: port the override to kombu's new version"
CALLED = "called by shardfuse.workers.broker.transport: check it still does what our override relies on"
DRIVES = ("kombu's poller drives the receive through it (_in_poll, _brpop_sent_at, _brpop_start): check our "
          "BLMOVE receive (transport.Channel._brpop_start/_brpop_read) still fits")
RESTORE = "called by shardfuse.workers.runtime (dead-worker redelivery): check it still restores by delivery tag"
SENTINEL = ("mixed into transport.SentinelChannel under our Channel: check the Sentinel master's pool still reaches "
            "our BLMOVE receive (self.client / self.pool)")
TLS = ("turns a rediss:// URL's ssl_* parameters into Connection.ssl, which transport.TlsChannel keeps (and "
       "defaults to verified TLS when there are none)")
SET_ASIDE = "called by transport.Channel._set_aside to forget a message refused after kombu recorded it"

# "module:qualified.name" -> (signature, sha256 of the source's first 16 hex digits, what to re-check)
RECORDED: dict[str, tuple[str, str, str]] = {
    "kombu.transport.redis:QoS.append": ("(self, message, delivery_tag)", "35c655f6ecc62fe6", OVERRIDE),
    "kombu.transport.redis:QoS.pipe_or_acquire": ("(self, pipe=None, client=None)", "ad7f549d96c81107", CALLED),
    "kombu.transport.redis:QoS.restore_by_tag": ("(self, tag, client=None, leftmost=False)", "58e161d81b6fe18d",
                                                 RESTORE),
    "kombu.transport.redis:Channel.__init__": ("(self, *args, **kwargs)", "f189bdebe2436ccd", OVERRIDE),
    "kombu.transport.redis:Channel._connparams": ("(self, asynchronous=False)", "e9a4295085a8fb90", OVERRIDE),
    "kombu.transport.redis:Channel._create_client": ("(self, asynchronous=False)", "dae92bc4075dafb9", OVERRIDE),
    "kombu.transport.redis:Channel._brpop_start": ("(self, timeout=None)", "06723d707ddf2240", OVERRIDE),
    "kombu.transport.redis:Channel._brpop_read": ("(self, **options)", "c42518699709f2df", OVERRIDE),
    "kombu.transport.redis:Channel._on_connection_disconnect": ("(self, connection)", "9eab3394f78b076c", OVERRIDE),
    "kombu.transport.redis:Channel.close": ("(self)", "101e9b9cdad44b88", OVERRIDE),
    "kombu.transport.redis:Channel._flush_brpop_reauth": ("(self)", "bb4930b4fd3cf8f3", CALLED),
    "kombu.transport.redis:Channel.conn_or_acquire": ("(self, client=None)", "25883caca6c4121e", CALLED),
    "kombu.transport.redis:Channel.pool": ("(self)", "5a99b1533403c64d", CALLED),
    "kombu.transport.redis:Channel.client": ("(self)", "7a86dff4bd9c8b6f", CALLED),
    "kombu.transport.redis:Channel._poll_error": ("(self, type, **options)", "2c941c0124b99fab", DRIVES),
    "kombu.transport.redis:MultiChannelPoller._register_BRPOP": ("(self, channel)", "85724582464a615f", DRIVES),
    "kombu.transport.redis:MultiChannelPoller._pause_brpop": ("(self, channel, fileno)", "58133695f1a9f4fb", DRIVES),
    "kombu.transport.redis:MultiChannelPoller._update_brpop_polling": ("(self)", "de7b4600acf540fb", DRIVES),
    "kombu.transport.redis:MultiChannelPoller.maybe_check_brpop_health": ("(self)", "0dc592e46353a0fc", DRIVES),
    "kombu.transport.redis:MultiChannelPoller.on_readable": ("(self, fileno)", "c0d99f241607f845", DRIVES),
    "kombu.transport.virtual.base:QoS.append": ("(self, message, delivery_tag)", "b388f0cd6485c28a", CALLED),
    "kombu.transport.virtual.base:Message.__init__": ("(self, payload, channel=None, **kwargs)", "c90d08ccfa2e3e9a",
                                                      "sets message._raw, which transport.QoS.append records"),
    "kombu.transport.virtual.base:Transport._deliver": ("(self, message, queue)", "799e242f3ec53863", CALLED),
    "kombu.transport.virtual.base:QoS.ack": ("(self, delivery_tag)", "0714292b916fecb2", SET_ASIDE),
    "kombu.transport.redis:SentinelChannel._get_pool": ("(self, asynchronous=False)", "6abc6e5c81e1880c", SENTINEL),
    "kombu.transport.redis:SentinelChannel._sentinel_managed_pool": ("(self, asynchronous=False)",
                                                                     "bde54a2d6e93ac13", SENTINEL),
    "kombu.utils.url:parse_url": ("(url)", "e01611c7c7ad15ec", TLS),
}

# Class attributes our code reads, sets or mirrors, with the values it assumes.
ATTRIBUTES: dict[str, tuple[Any, str]] = {
    "kombu.transport.redis:Channel._in_poll": (False, "set by transport.Channel._brpop_start, read by the poller"),
    "kombu.transport.redis:Channel._brpop_sent_at": (None, "set by transport.Channel._brpop_start (health check)"),
    "kombu.transport.redis:Channel._closing": (False, "set by transport.Channel.close"),
    "kombu.transport.redis:Channel.unacked_key": ("unacked", "broker.redelivery.UNACKED and workers.monitor read it"),
    "kombu.transport.redis:Channel.unacked_index_key": ("unacked_index", "broker.redelivery.UNACKED_INDEX, monitor"),
    "kombu.transport.redis:Channel.sep": ("\x06\x16", "workers.monitor names priority queues with it"),
    "kombu.transport.redis:PRIORITY_STEPS": ([0, 3, 6, 9], "workers.monitor counts these priority queues"),
}


def _resolve(target: str) -> Any:
    module, _, path = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in path.split("."):
        obj = inspect.getattr_static(obj, part)
    return obj


def _function(target: str) -> Callable[..., Any]:
    obj = _resolve(target)
    if isinstance(obj, property):
        obj = obj.fget
    elif isinstance(obj, functools.cached_property):
        obj = obj.func
    assert callable(obj), f"{target} is no longer a function or property"
    return obj  # type: ignore[no-any-return]


def _observed(target: str) -> tuple[str, str]:
    function = _function(target)
    source = inspect.getsource(function)
    return str(inspect.signature(function)), hashlib.sha256(source.encode()).hexdigest()[:16]


def _pins() -> dict[str, str]:
    """The exact version pyproject.toml pins for each recorded distribution."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in project["dependencies"]:
        requirement = Requirement(line)
        if requirement.name in RECORDED_FOR:
            specs = list(requirement.specifier)
            assert len(specs) == 1 and specs[0].operator == "==", (
                f"pyproject.toml must pin {requirement.name} exactly (==), not {requirement.specifier}: "
                "shardfuse.workers.broker.transport is only tested against the recorded versions")
            pins[requirement.name] = specs[0].version
    return pins


def test_pyproject_pins_exactly_the_recorded_versions() -> None:
    assert _pins() == RECORDED_FOR, (
        "pyproject.toml's celery/kombu/redis pins differ from the versions kombu's private API was recorded for "
        f"here ({RECORDED_FOR}): re-check every recorded object against the new versions (see this module's "
        "docstring), then update RECORDED_FOR")


@pytest.mark.parametrize("distribution", sorted(RECORDED_FOR))
def test_the_installed_version_is_the_pinned_one(distribution: str) -> None:
    installed = importlib.metadata.version(distribution)
    assert installed == RECORDED_FOR[distribution], (
        f"{distribution} {installed} is installed, but shardfuse.workers.broker.transport was checked against "
        f"{RECORDED_FOR[distribution]} (pyproject.toml's pin): reinstall the pinned version, or re-check every "
        "object in this module against the new one before recording it")


@pytest.mark.parametrize("target", sorted(RECORDED))
def test_a_private_kombu_method_is_as_recorded(target: str) -> None:
    signature, digest, recheck = RECORDED[target]
    observed_signature, observed_digest = _observed(target)
    assert observed_signature == signature, (
        f"{target} now takes {observed_signature}, recorded {signature}: {recheck}")
    assert observed_digest == digest, (
        f"{target} changed (source sha256 {observed_digest}, recorded {digest}): {recheck}")


@pytest.mark.parametrize("target", sorted(ATTRIBUTES))
def test_a_kombu_attribute_has_the_value_we_assume(target: str) -> None:
    value, used_by = ATTRIBUTES[target]
    assert _resolve(target) == value, f"{target} is no longer {value!r}; {used_by}: re-check that code"


def test_every_kombu_name_our_transport_shadows_is_recorded() -> None:
    """An override added to the transport (or a kombu release adding a name the transport already uses)
    must be recorded above, so that the next kombu change to it fails here."""
    from kombu.transport import redis as kombu_redis

    from shardfuse.workers.broker import transport

    recorded = {target.partition(":")[2] for target in (*RECORDED, *ATTRIBUTES)}
    pairs = [(transport.QoS, kombu_redis.QoS), (transport.Channel, kombu_redis.Channel),
             (transport.Transport, kombu_redis.Transport), (transport.TlsChannel, kombu_redis.Channel),
             (transport.TlsTransport, kombu_redis.Transport),
             (transport.SentinelChannel, kombu_redis.SentinelChannel),
             (transport.SentinelTransport, kombu_redis.SentinelTransport)]
    shadowed = {f"{theirs.__name__}.{name}" for ours, theirs in pairs for name in vars(ours)
                if hasattr(theirs, name) and not (name.startswith("__") and name != "__init__")}
    # Our classes plugged into kombu's: the point of subclassing, not a private API. kombu's transport options
    # are extended (max_message_bytes), never replaced.
    shadowed -= {"Channel.QoS", "Transport.Channel", "SentinelTransport.Channel", "Channel.from_transport_options",
                 "SentinelChannel.from_transport_options"}
    assert shadowed <= recorded, f"record kombu's {sorted(shadowed - recorded)} in this module (see its docstring)"


if __name__ == "__main__":  # print the values to record after a deliberate bump
    for name in sorted(RECORDED_FOR):
        print(f'    "{name}": "{importlib.metadata.version(name)}",')
    for name in sorted(RECORDED):
        print(f'    "{name}": {_observed(name)},')
