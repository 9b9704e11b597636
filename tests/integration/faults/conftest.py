"""What the fault-injection tests share.

Each test module runs a whole stack of its own (``running_stack``: Redis, PostgreSQL, four worker pools,
Flower), so killing or stopping a component never disturbs another test. Around that: a deterministic
corpus (:func:`make_corpus`); :class:`StreamPublisher`, which streams it through the real publisher and
broker sink in a background thread and flushes again a message the broker refused (the sink keeps its
events: what a user of the publisher would do); :func:`kill_tree` and :func:`restart` (``launcher.up(only=…)``
with the stack's settings); :func:`drain` (``shardfuse wait``, stricter); :func:`snapshot` and
:func:`assert_same_as_clean`, which read a zone's rows straight from every shard's ``documents`` and
``chunks`` with psycopg and compare them exactly with a clean run of the same corpus; and
:func:`assert_both_legs`, which searches for every document on the keyword and the semantic leg.

The broker's visibility timeout is 40 s (task limits lowered with it: the settings require it to exceed
every hard limit) so that kombu's Redis transport gives back what a killed worker held within a test.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import psycopg
from psycopg import sql

from shardfuse.pipeline.admin.publisher import Publisher
from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.errors import StoreUnavailableError
from shardfuse.pipeline.index.store.schema import SHARED_SCHEMA
from shardfuse.pipeline.storage.cas import LocalContentStore
from shardfuse.workers import monitor
from shardfuse.workers.names import PIPELINE_QUEUES
from shardfuse.workers.publishing import CeleryEventSink
from shardfuse.workers.stack import processes, up
from shardfuse.workers.stack.layout import StackLayout
from tests.integration.conftest import Stack, running_stack
from tests.integration.faults.both_legs import Expected, LegsReport, assert_found_on_both_legs, unique_word
from tests.integration.faults.pending import describe_pending

DOCUMENTS = 2000
CORPUS_SEED = 6
VISIBILITY_TIMEOUT_S = 40
# Hard limits below the visibility timeout (the settings validate it); soft limits leave the tasks time to
# settle their items before the hard kill.
TASK_LIMITS = {"INGEST": (20, 25), "EMBED": (25, 30), "MAINTENANCE": (30, 35), "QUERY": (15, 20)}

FAULT_OVERRIDES: dict[str, str] = {
    "SHARDFUSE_EMBEDDER__PROVIDER": "hashing",
    "SHARDFUSE_EMBEDDER__DIMENSIONS": "64",
    "SHARDFUSE_SHARDS": "2",
    # Small chunks: the corpus below gives 1 to 8 chunks a document (~6,000 in all), so that per-path
    # chunk counts say something.
    "SHARDFUSE_CHUNKING__MAX_TOKENS": "96",
    "SHARDFUSE_CHUNKING__OVERLAP_TOKENS": "8",
    "SHARDFUSE_BM25__REBUILD_DEBOUNCE_S": "0.5",
    "SHARDFUSE_VECTOR_INDEX__BUILD_DEBOUNCE_S": "0.5",
    "SHARDFUSE_BROKER__VISIBILITY_TIMEOUT_S": str(VISIBILITY_TIMEOUT_S),
    # One document's deadline: half the ingest soft limit below, as the defaults have it (60 s of 120 s); the
    # settings require it under the soft limit.
    "SHARDFUSE_INGEST__DOCUMENT_DEADLINE_S": "10",
    **{f"SHARDFUSE_WORKERS__{queue}_LIMITS__SOFT_S": str(soft) for queue, (soft, _) in TASK_LIMITS.items()},
    **{f"SHARDFUSE_WORKERS__{queue}_LIMITS__HARD_S": str(hard) for queue, (_, hard) in TASK_LIMITS.items()},
}

_SYLLABLES = ("ka", "lo", "mi", "ren", "tas", "vo", "qui", "zen", "dor", "pal", "ex", "ul", "bri", "sto",
              "fen", "gar", "nu", "shi", "ter", "wa", "yel", "pon", "cra", "di")  # fmt: skip


LOG_COPIES = Path(tempfile.gettempdir()) / "shardfuse-fault-logs"


@contextlib.contextmanager
def own_stack(name: str, extra: dict[str, str] | None = None) -> Iterator[Stack]:
    """A whole stack for one test module: :data:`FAULT_OVERRIDES` plus ``extra``. Its component logs are
    copied to ``$TMPDIR/shardfuse-fault-logs/<name>/`` before it stops (its data dir is then deleted)."""
    with running_stack({**FAULT_OVERRIDES, **(extra or {})}) as stack:
        try:
            yield stack
        finally:
            target = LOG_COPIES / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(stack.settings.data_path / "logs", target, dirs_exist_ok=True)


# -- corpus -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Doc:
    name: str  # relative path; each run publishes it under a prefix of its own
    data: bytes
    word: str  # a made-up word in its first sentence that no other document of the corpus contains


def make_corpus(n: int = DOCUMENTS, *, seed: int = CORPUS_SEED) -> list[Doc]:
    """``n`` distinct plain-text documents of 2-4 paragraphs of made-up words, the same for the same seed. The
    first sentence of document ``i`` holds its unique word (:func:`unique_word`: consonants only, so none of
    the syllable words equals it), which the keyword leg of :func:`assert_both_legs` searches for."""
    rng = random.Random(seed)
    words = sorted({"".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(3000)})
    docs = []
    for i in range(n):
        paragraphs = [f"Document {i} of the fault corpus, marked {unique_word(i)}."]
        for p in range(rng.randint(2, 4)):
            sentences = []
            for _ in range(rng.randint(1, 4)):
                sentence = " ".join(rng.choice(words) for _ in range(rng.randint(4, 10)))
                sentences.append(sentence.capitalize() + ".")
            paragraphs.append(f"Part {p} of {i}: " + " ".join(sentences))
        docs.append(Doc(name=f"docs/{i:04d}.txt", data="\n\n".join(paragraphs).encode(), word=unique_word(i)))
    return docs


# -- publishing -------------------------------------------------------------------------------------------
class StreamPublisher(threading.Thread):
    """Publishes ``corpus`` into ``zone`` under ``prefix/`` in a background thread, sleeping ``pace_s`` after
    every message (``broker.events_per_message`` events), so that a fault can land mid-stream.

    ``seq`` is chosen here (the publisher's own clock would be the same, ``time.time_ns()``) so that the
    seq of every path is known even when a send failed. When the broker refuses a message the sink keeps
    its events; the thread flushes again every half second until the broker takes them, counting the
    refusals in :attr:`refused`. Nothing is ever sent twice by this thread.
    """

    def __init__(self, stack: Stack, zone: str, corpus: list[Doc], *, prefix: str, pace_s: float = 0.0,
                 retry_for_s: float = 120.0) -> None:
        super().__init__(name=f"publish-{zone}", daemon=True)
        self.stack, self.zone, self.corpus, self.prefix = stack, zone, corpus, prefix
        self.pace_s, self.retry_for_s = pace_s, retry_for_s
        self.seqs: dict[str, int] = {}
        self.handed = 0  # events handed to the sink
        self.refused = 0  # sends the broker refused (retried)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            settings = self.stack.settings
            per_message = settings.broker.events_per_message
            with CeleryEventSink.connect(settings) as sink:
                publisher = Publisher(cas=LocalContentStore(settings.cas_root), sink=sink)
                for doc in self.corpus:
                    seq = self.seqs[doc.name] = time.time_ns()
                    try:
                        publisher.write(zone=self.zone, path=f"{self.prefix}/{doc.name}", data=doc.data, seq=seq)
                    except StoreUnavailableError:  # the sink still holds the event: flush it again
                        self.refused += 1
                        time.sleep(0.5)
                        self._flush_until_accepted(sink)
                    self.handed += 1
                    if self.pace_s and self.handed % per_message == 0:
                        time.sleep(self.pace_s)
                self._flush_until_accepted(sink)
        except BaseException as exc:  # noqa: BLE001 - reported by join_checked
            self.error = exc

    def _flush_until_accepted(self, sink: CeleryEventSink) -> None:
        deadline = time.monotonic() + self.retry_for_s
        while True:
            try:
                sink.flush()
                return
            except StoreUnavailableError:
                self.refused += 1
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)

    def wait_handed(self, count: int, timeout: float = 120.0) -> None:
        """Block until ``count`` events were handed to the sink (safety bound ``timeout``)."""
        deadline = time.monotonic() + timeout
        while self.handed < count and self.is_alive():
            assert time.monotonic() < deadline, f"publisher stuck at {self.handed} events"
            time.sleep(0.05)

    def join_checked(self, timeout: float = 180.0) -> None:
        self.join(timeout)
        assert not self.is_alive(), "publisher thread did not finish"
        if self.error is not None:
            raise AssertionError(f"publisher failed: {self.error!r}") from self.error
        assert self.handed == len(self.corpus)


def publish_clean(stack: Stack, zone: str, corpus: list[Doc], *, prefix: str,
                  timeout: float = 240.0) -> tuple[ZoneSnapshot, float]:
    """Publish ``corpus`` with no fault, wait until indexed; its snapshot and the seconds it took."""
    started = time.monotonic()
    publisher = StreamPublisher(stack, zone, corpus, prefix=prefix)
    publisher.start()
    publisher.join_checked()
    drain(stack, timeout=timeout)
    return snapshot(stack.settings, zone, prefix=prefix), time.monotonic() - started


# -- processes --------------------------------------------------------------------------------------------
def kill_tree(stack: Stack, name: str) -> list[int]:
    """SIGKILL component ``name``: its process and every descendant (collected before the first kill, so
    that pool children are not missed once they are orphaned). Returns the pids killed, all gone."""
    leader = psutil.Process(stack.state.components[name].pid)
    tree = [leader, *leader.children(recursive=True)]
    for proc in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    for proc in tree:
        assert processes.wait_gone(proc.pid, timeout=10), f"{name} process {proc.pid} survived SIGKILL"
    return [proc.pid for proc in tree]


def restart(stack: Stack, only: Collection[str], *, timeout: float = 120.0) -> float:
    """``launcher.up(only=…)`` with the stack's settings (which it hands the workers it starts); seconds it
    took."""
    started = time.monotonic()
    stack.state = up(stack.settings, only=set(only), progress=lambda line: None, timeout=timeout)
    return time.monotonic() - started


def wait_in_flight(stack: Stack, queue: str, *, timeout: float = 60.0) -> int:
    """Block until a worker holds at least one unacknowledged ``queue`` message (so that a kill lands on work
    in flight); the count then. Safety bound ``timeout``."""
    client = monitor.broker_client(stack.settings)
    deadline = time.monotonic() + timeout
    try:
        while (held := monitor.unacked_by_queue(client)[queue]) == 0:
            assert time.monotonic() < deadline, f"no {queue} message was ever in flight"
            time.sleep(0.02)
        return held
    finally:
        client.close()


PIPELINE_WORKERS = ("worker-ingest", "worker-embed", "worker-maintenance")


class ComponentDied(AssertionError):
    """A worker pool of the stack exited by itself (nobody killed it)."""


def dead_components(stack: Stack, names: Collection[str] = PIPELINE_WORKERS) -> list[str]:
    return [name for name in names if not stack.state.components[name].is_alive()]


def drain(stack: Stack, *, timeout: float = 300.0, quiet_s: float = 2.0) -> None:
    """Wait as ``shardfuse wait`` does, stricter: until no message waits or is unacknowledged in the ingest,
    embed and maintenance queues and every shard's BM25 generation is current (``monitor.pending_work``),
    and that stays so for ``quiet_s``. Unlike ``shardfuse wait`` it never re-sends a lost BM25 rebuild: the
    maintenance worker must do that by itself (``shardfuse.workers.lifecycle._rebuild_watchdog``; counted by
    :func:`rebuilds_resent`). Raises :class:`ComponentDied` at once if a pipeline pool is gone, rather than
    waiting out ``timeout`` (a safety bound, not a measurement) for work nobody will do.

    The quiet spell matters: ``pending_work`` reads the queue lists and then the ``unacked`` hash, so a
    message restored from the second to the first between the two reads looks like no work for one poll.
    """
    settings = stack.settings
    deadline = time.monotonic() + timeout
    client = monitor.broker_client(settings)
    quiet_since: float | None = None
    checked = 0.0
    try:
        while True:
            now = time.monotonic()
            if now - checked >= 1.0:
                checked = now
                dead = dead_components(stack)
                if dead:
                    raise ComponentDied(f"{dead} exited by themselves; see {LOG_COPIES} once the module ends")
            state = monitor.pending_work(settings, client)
            quiet_since = None if not state["idle"] else quiet_since or now
            if quiet_since is not None and now - quiet_since >= quiet_s:
                return
            if now >= deadline:
                detail = describe_pending(client, queues=[q.value for q in PIPELINE_QUEUES],
                                          logs=StackLayout(settings.data_path).logs_dir)
                raise AssertionError(f"the pipeline did not drain within {timeout:.0f} s: {state}\n"
                                     + "\n".join(detail))
            time.sleep(0.2)
    finally:
        client.close()


def rebuilds_resent(stack: Stack) -> int:
    """How many lost BM25 rebuilds the maintenance worker has re-sent so far (its log says each)."""
    log_file = StackLayout(stack.settings.data_path).log_file("worker-maintenance")
    return log_file.read_text(errors="replace").count("no rebuild is queued: sending one")


# -- what the shards hold ---------------------------------------------------------------------------------
@dataclass
class ZoneSnapshot:
    """One zone's rows across every shard, paths relative to the run's prefix."""

    zone: str
    documents: dict[str, tuple[int, str, int]] = field(default_factory=dict)  # path -> (seq, status, chunk_count)
    chunk_rows: Counter[str] = field(default_factory=Counter)  # path -> rows in chunks
    duplicate_ordinals: list[tuple[str, int]] = field(default_factory=list)
    duplicate_chunk_ids: list[str] = field(default_factory=list)
    stale_chunks: list[str] = field(default_factory=list)  # paths with a chunk whose seq is not the document's
    paths_on_two_shards: list[str] = field(default_factory=list)
    dead_letters: int = 0

    @property
    def status_counts(self) -> Counter[str]:
        return Counter(status for _, status, _ in self.documents.values())

    @property
    def chunk_total(self) -> int:
        return sum(self.chunk_rows.values())

    def summary(self) -> str:
        return (f"{len(self.documents)} documents {dict(self.status_counts)}, {self.chunk_total} chunk rows, "
                f"{self.dead_letters} dead letters")


def snapshot(settings: Settings, zone: str, *, prefix: str) -> ZoneSnapshot:
    """Read ``zone``'s documents and chunks from every shard (``shard_<i>`` schemas) with plain psycopg."""
    snap = ZoneSnapshot(zone)
    lead = f"{prefix}/"
    ordinals: Counter[tuple[str, int]] = Counter()
    ids: Counter[str] = Counter()
    seen_on: dict[str, int] = {}
    chunk_seqs: list[tuple[str, int]] = []
    for shard in range(settings.shards):
        schema = sql.Identifier(f"shard_{shard}")
        with psycopg.connect(settings.shard_dsn(shard), connect_timeout=10) as conn:
            try:
                docs = conn.execute(sql.SQL("SELECT path, seq, status, chunk_count FROM {}.documents "
                                            "WHERE zone = %s").format(schema), (zone,)).fetchall()
                chunks = conn.execute(sql.SQL("SELECT path, seq, ordinal, chunk_id FROM {}.chunks "
                                              "WHERE zone = %s").format(schema), (zone,)).fetchall()
            except psycopg.errors.UndefinedTable:
                continue
        for path, seq, status, count in docs:
            rel = path.removeprefix(lead)
            if rel in seen_on:
                snap.paths_on_two_shards.append(rel)
            seen_on[rel] = shard
            snap.documents[rel] = (int(seq), str(status), int(count))
        for path, seq, ordinal, chunk_id in chunks:
            rel = path.removeprefix(lead)
            snap.chunk_rows[rel] += 1
            ordinals[(rel, int(ordinal))] += 1
            ids[chunk_id] += 1
            chunk_seqs.append((rel, int(seq)))
    snap.duplicate_ordinals = sorted(key for key, n in ordinals.items() if n > 1)
    snap.duplicate_chunk_ids = sorted(key for key, n in ids.items() if n > 1)
    snap.stale_chunks = sorted({rel for rel, seq in chunk_seqs
                                if rel not in snap.documents or snap.documents[rel][0] != seq})
    with psycopg.connect(settings.postgres.dsn, connect_timeout=10) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}.deadletters WHERE zone = %s")
                           .format(sql.Identifier(SHARED_SCHEMA)), (zone,)).fetchone()
    snap.dead_letters = int(row[0]) if row else 0
    return snap


def assert_consistent(snap: ZoneSnapshot) -> None:
    """Within one zone: no duplicate chunk, no stale chunk, every document's chunk_count equals its rows."""
    assert not snap.duplicate_ordinals, f"duplicate (zone, path, ordinal): {snap.duplicate_ordinals[:10]}"
    assert not snap.duplicate_chunk_ids, f"duplicate chunk ids: {snap.duplicate_chunk_ids[:10]}"
    assert not snap.stale_chunks, f"chunks of another seq than their document's: {snap.stale_chunks[:10]}"
    assert not snap.paths_on_two_shards, f"paths on two shards: {snap.paths_on_two_shards[:10]}"
    wrong = {p: (row[2], snap.chunk_rows[p]) for p, row in snap.documents.items() if row[2] != snap.chunk_rows[p]}
    assert not wrong, f"documents.chunk_count differs from their chunk rows: {dict(list(wrong.items())[:10])}"


def assert_same_as_clean(fault: ZoneSnapshot, clean: ZoneSnapshot, *, seqs: dict[str, int]) -> None:
    """``fault`` holds exactly what ``clean`` holds: every published path once, at the seq it was published
    with, with the same status and the same chunk count per path and in total, and nothing dead-lettered."""
    assert_consistent(clean)
    assert_consistent(fault)
    missing = sorted(set(seqs) - set(fault.documents))
    assert not missing, f"{len(missing)} of {len(seqs)} documents missing after the fault: {missing[:10]}"
    extra = sorted(set(fault.documents) - set(seqs))
    assert not extra, f"documents nobody published: {extra[:10]}"
    wrong_seq = [p for p, s in seqs.items() if fault.documents[p][0] != s]
    assert not wrong_seq, f"documents not at their published seq: {wrong_seq[:10]}"
    assert fault.status_counts == clean.status_counts, (fault.status_counts, clean.status_counts)
    per_path = {p: (fault.documents[p][2], clean.documents.get(p, (0, "", -1))[2]) for p in fault.documents}
    differ = {p: counts for p, counts in per_path.items() if counts[0] != counts[1]}
    assert not differ, f"chunk counts (fault, clean) differ: {dict(list(differ.items())[:10])}"
    assert fault.chunk_total == clean.chunk_total
    assert fault.dead_letters == 0 and clean.dead_letters == 0, (fault.dead_letters, clean.dead_letters)


def assert_both_legs(stack: Stack, zone: str, corpus: list[Doc], *, prefix: str) -> LegsReport:
    """Every document of ``corpus`` published into ``zone`` under ``prefix/`` is found by search on both legs:
    its unique word by the keyword leg (the published BM25 index), its first chunk by the semantic leg
    (:mod:`tests.integration.faults.both_legs`). Fails naming each miss, its shard and leg; call it after
    :func:`drain`, which waits until every shard's BM25 index is current."""
    expected = [Expected(path=f"{prefix}/{doc.name}", word=doc.word) for doc in corpus]
    return assert_found_on_both_legs(stack.settings, zone, expected)


def wait_for_documents(settings: Settings, zone: str, *, count: int, timeout: float) -> None:
    """Block until ``zone`` holds at least ``count`` document rows (``timeout`` is a safety bound only)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = 0
        for shard in range(settings.shards):
            with (psycopg.connect(settings.shard_dsn(shard), connect_timeout=10) as conn,
                  contextlib.suppress(psycopg.errors.UndefinedTable)):
                row = conn.execute(sql.SQL("SELECT count(*) FROM {}.documents WHERE zone = %s")
                                   .format(sql.Identifier(f"shard_{shard}")), (zone,)).fetchone()
                held += int(row[0]) if row else 0
        if held >= count:
            return
        time.sleep(0.2)
