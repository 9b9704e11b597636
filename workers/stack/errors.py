"""Errors of the embedded stack launcher."""

from __future__ import annotations

from shardfuse.pipeline.core.errors import ShardfuseError


class StackError(ShardfuseError):
    """A component of the embedded stack could not be started, reached or stopped.

    The message names the component and, where there is one, the log file a person should read next.
    """
