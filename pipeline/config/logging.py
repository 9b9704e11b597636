"""The ``[logging]`` section of :class:`shardfuse.pipeline.config.settings.Settings`."""

from __future__ import annotations

from typing import Literal

from shardfuse.pipeline.config.section import Section as _Section


class LoggingSettings(_Section):
    """How workers and the CLI write log lines: ``text`` (as before) or ``json`` (one object per line with
    time, level, logger, message, host, pid, and the task, event id and zone a line is about)."""

    format: Literal["text", "json"] = "text"
