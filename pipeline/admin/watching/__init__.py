"""``shardfuse watch``: follow a source tree's file system events and publish its writes, deletes and renames
as they happen.

The observer (:mod:`.fs_observer`, watchdog) only enqueues :class:`~.events.FsEvent`s; everything else runs on
the caller's thread. Events only say *where to look*: the :class:`~.debouncer.Debouncer` holds each touched
path until it has been quiet for a moment, then :mod:`.resolution` compares what is on disk now (walked exactly
as ``shardfuse publish`` walks it) with the :class:`~.ledger.Ledger` of what the index holds, and the
:class:`~.watcher.Watcher` publishes the difference. Deciding by the final state, not by the sequence of events,
is what makes an editor's save-by-rename one write of the target and a vanished temp file nothing at all.
On start, :mod:`.catch_up` runs ``reconcile`` (the index itself is the state: no state file of our own), which
also fills the ledger; :mod:`.follow` is the loop, with retries that keep every pending change.
"""
