"""Argument types the commands share: a value one refuses is reported as ``shardfuse CMD: error: argument
--X: ...`` with exit status 2, before anything is read, stored or sent. (A value that is not a number at all
argparse reports itself, from the ``ValueError``: ``invalid port value: 'x'``.)"""

from __future__ import annotations

import argparse

from shardfuse.pipeline.core.zones import check_zone


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def port(text: str) -> int:
    value = int(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"not a TCP port (1 to 65535): {value}")
    return value


def zone(text: str) -> str:
    """A zone name by the rule write events and search requests check (``pipeline/core/zones.py``), so a bad
    one is refused once, up front, rather than once a file after each file's bytes went into the CAS."""
    try:
        return check_zone(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
