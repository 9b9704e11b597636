"""The embedded stack's object store as one of its components: whether the settings ask for it, and starting,
recognising and checking it (the server itself, SeaweedFS's ``weed``: :mod:`.object_store`).

``shardfuse up`` runs it when ``cas.url`` is ``s3://…`` and ``cas.s3.endpoint_url`` is ``http://`` on a
loopback address with a port (``http://127.0.0.1:18333``): the stack's own S3, with its data under
``<data_dir>/objects`` and keys generated into the stack's secrets file (an explicit ``cas.s3.access_key_id``
/ ``secret_access_key`` wins and becomes the server's). Any other ``cas.url`` (the default local folder, a
remote S3) starts nothing, and nothing of boto3 is imported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from shardfuse.pipeline.config.cas_location import S3Location
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.config.stack_secrets import LOCALHOST_NAMES, embedded_s3_port, is_loopback
from shardfuse.pipeline.core.errors import ConfigurationError, ShardfuseError, TransientError
from shardfuse.workers.stack import processes
from shardfuse.workers.stack.errors import StackError
from shardfuse.workers.stack.layout import StackLayout
from shardfuse.workers.stack.object_store import start_object_store
from shardfuse.workers.stack.state import ComponentState

NAME = "object-store"
# One readiness probe: a single request, no retry budget (the launcher polls until its deadline).
PROBE_TIMEOUT_S = 2.0
# ``down``'s grace before SIGKILL. weed has flushed and shut its volume server within milliseconds of SIGTERM,
# then its process lingers ~15 s (measured, weed 4.48, with no client left) before it exits. A store killed
# outright keeps what it acknowledged (tests/integration/test_stack_object_store.py SIGKILLs one, reads back).
STOP_GRACE_S = 5.0


@dataclass(frozen=True)
class ObjectStoreTarget:
    """Where the embedded object store serves S3: the address it binds and its S3 port (it takes the next
    seven ports too)."""

    host: str
    port: int


def embedded_target(settings: Settings) -> ObjectStoreTarget | None:
    """Where the stack is to run the object store, or None if the settings' CAS is not on this machine's S3.

    ConfigurationError if the endpoint is ``http://`` on loopback without a port: the stack would not know
    which one to serve."""
    if not isinstance(settings.cas.location, S3Location):
        return None
    endpoint = settings.cas.s3.endpoint_url
    try:
        parts = urlsplit(endpoint)
        host = parts.hostname
    except ValueError:
        return None
    if parts.scheme != "http" or not host or not is_loopback(host):
        return None  # an S3 elsewhere (or behind TLS on loopback): not the stack's to run
    port = embedded_s3_port(endpoint)
    if port is None:
        raise ConfigurationError(f"cas.s3.endpoint_url {endpoint!r} names this machine but no port: give the port "
                                 "the embedded object store is to serve S3 on (e.g. http://127.0.0.1:18333)")
    return ObjectStoreTarget(host="127.0.0.1" if host.lower() in LOCALHOST_NAMES else host, port=port)


def cmdline_marks(target: ObjectStoreTarget) -> tuple[str, ...]:
    """What the running server's command line shows (:func:`.object_store.weed_command`)."""
    return ("weed", "server", f"-s3.port={target.port}")


def refuse_moved(recorded: ComponentState | None, target: ObjectStoreTarget) -> None:
    """StackError if the recorded server still runs, on another S3 port than the settings now name."""
    if recorded is not None and recorded.is_alive() and recorded.cmdline_marks != cmdline_marks(target):
        raise StackError(f"the {NAME} (pid {recorded.pid}) runs on another port than cas.s3.endpoint_url's "
                         f"{target.port}; run `shardfuse down` first")


def start(target: ObjectStoreTarget, *, settings: Settings, layout: StackLayout, deadline: float) -> ComponentState:
    """Start the server with the settings' S3 keys and return its recorded state once it answers (StackError
    with its log's tail if it does not by ``deadline``)."""
    s3 = settings.cas.s3
    server = start_object_store(
        layout.objects_dir, host=target.host, s3_port=target.port,
        access_key=s3.access_key_id, secret_key=s3.secret_access_key.get_secret_value(),
        log_path=layout.log_file(NAME), ready_timeout_s=max(1.0, deadline - time.monotonic()),
    )  # fmt: skip
    return ComponentState(pid=server.pid, log=server.log_path, started_at=processes.process_started_at(server.pid),
                          cmdline_marks=cmdline_marks(target))  # fmt: skip


def bucket_ready(settings: Settings, *, announce: Callable[[str], None]) -> Callable[[], bool]:
    """A readiness probe that also creates the CAS bucket: True once the bucket exists (``announce`` is told
    if this probe created it), False while the server cannot answer yet. StackError if it refuses the keys
    (a server started with other keys: only a restart gives it these)."""
    # Imported here: boto3 takes a while to import, and a stack with a local CAS never needs it.
    from shardfuse.pipeline.storage.s3_store import S3ContentStore

    location = settings.cas.location
    assert isinstance(location, S3Location)  # embedded_target said so
    probe = settings.cas.s3.model_copy(update={"retry_budget_s": 0.0, "connect_timeout_s": PROBE_TIMEOUT_S,
                                               "read_timeout_s": PROBE_TIMEOUT_S})  # fmt: skip

    def ready() -> bool:
        store = S3ContentStore(location=location, settings=probe)
        try:
            if store.ensure_bucket():
                announce(f"{NAME}: created the bucket {location.bucket!r}")
            return True
        except TransientError:
            return False
        except ShardfuseError as exc:
            raise StackError(f"{NAME}: {exc}. If it runs with other keys (a deleted secrets file): "
                             "`shardfuse down`, then `shardfuse up` restarts it with these") from None
        finally:
            store.close()

    return ready
