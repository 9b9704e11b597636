"""The ``[watch]`` section of :class:`shardfuse.pipeline.config.settings.Settings`: ``shardfuse watch``."""

from __future__ import annotations

from pydantic import Field

from shardfuse.pipeline.config.section import Section as _Section


class WatchSettings(_Section):
    """How ``shardfuse watch`` turns file system events into published changes
    (:mod:`shardfuse.pipeline.admin.watching`)."""

    # A path is published once it has seen no event for this long: an editor's save (temp file, rename over
    # the target; or vim's backup rename) and a copy in progress become one write of the final content.
    settle_ms: int = Field(default=250, ge=0, le=60_000)
    # ...but a file that never stops changing (a log) is published at least this often.
    max_delay_ms: int = Field(default=2000, ge=0, le=600_000)
    # Publishing that fails (the broker out of reach) is retried, the changes kept, with backoff up to this.
    retry_max_s: float = Field(default=10.0, gt=0, le=3600)
