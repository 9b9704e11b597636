"""The options every ``shardfuse`` command takes (``--config``, ``--data-dir``, ``-v``), accepted before the
subcommand and after it: ``shardfuse --data-dir X up`` and ``shardfuse up --data-dir X`` mean the same.

The top-level parser declares them with their defaults; every subcommand's parser (nested ones too:
``deadletters list``) declares them again with ``default=argparse.SUPPRESS``, so a subcommand that was not
given one leaves the top-level value in place, and one given after the subcommand overrides one given
before it (argparse copies a subcommand's parsed values over the top-level ones). The last one given wins.
Each subcommand's ``--help`` lists them.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import shtab

GLOBAL_DESTS = frozenset({"config", "data_dir", "verbose"})


def add_global_options(parser: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """Declare the global options on ``parser``; ``suppress``: without defaults (a subcommand's parser)."""
    group = parser.add_argument_group("global options (before or after the command)") if suppress else parser
    default = argparse.SUPPRESS if suppress else None
    config = group.add_argument("--config", metavar="FILE", default=default,
                                help="TOML settings file (environment variables still win)")
    data_dir = group.add_argument("--data-dir", metavar="DIR", default=default,
                                  help="where the embedded stack keeps its data")
    # What the shell completion scripts offer for their value (shardfuse.workers.cli.completion).
    setattr(config, "complete", shtab.FILE)  # noqa: B010 - shtab reads an attribute argparse does not declare
    setattr(data_dir, "complete", shtab.DIRECTORY)  # noqa: B010
    group.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS if suppress else False,
                       help="log debug output")


def spread_global_options(parser: argparse.ArgumentParser) -> None:
    """Declare the global options on every subcommand parser below ``parser`` (call it once every command is
    registered)."""
    for sub in subcommand_parsers(parser):
        add_global_options(sub, suppress=True)


def subcommand_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every parser of a subcommand below ``parser``, nested ones included, each once (aliases share one)."""
    seen: set[int] = set()
    pending = [parser]
    while pending:
        current = pending.pop()
        for action in current._actions:  # argparse keeps no public list of a parser's subcommands
            if not isinstance(action, argparse._SubParsersAction):
                continue
            for child in action.choices.values():
                if id(child) not in seen:
                    seen.add(id(child))
                    pending.append(child)
                    yield child
