"""``shardfuse``: run the embedded stack, publish, search and watch the index."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from shardfuse.pipeline.config.settings import Settings, load_settings
from shardfuse.pipeline.core.errors import ShardfuseError
from shardfuse.workers.cli import (
    api,
    chunks,
    completion,
    content,
    deadletters,
    eval_code,
    evaluate,
    maintenance,
    operations,
    querying,
    reconcile,
    reindex,
    serve,
    unreadable,
    watch,
)
from shardfuse.workers.cli import metrics as exporter_cli
from shardfuse.workers.cli.global_options import add_global_options, spread_global_options
from shardfuse.workers.logs import configure_cli_logging

Command = Callable[[argparse.Namespace, Settings], int]
DISTRIBUTION = "shardfuse"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardfuse",
        description="Hybrid (BM25 + pgvector) search index kept in step with a content-addressed store.",
    )
    add_global_options(parser)
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    operations.register(sub)
    content.register(sub)
    chunks.register(sub)
    deadletters.register(sub)
    querying.register(sub)
    evaluate.register(sub)
    eval_code.register(sub)
    serve.register(sub)
    reindex.register(sub)
    reconcile.register(sub)
    maintenance.register(sub)
    unreadable.register(sub)
    exporter_cli.register(sub)
    api.register(sub)
    watch.register(sub)
    completion.register(sub, parser_factory=build_parser)
    # Last: every command registered above takes the global options after its name too.
    spread_global_options(parser)
    return parser


def installed_version() -> str:
    """The installed distribution's version (what ``pip show shardfuse`` says)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: running from a source tree)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "standalone", None) is not None:  # needs no settings (shardfuse completion)
        return int(args.standalone(args))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    # --data-dir is an override like any other; processes the command starts get the settings it resolves.
    overrides = {"data_dir": Path(args.data_dir).absolute()} if args.data_dir else {}
    try:
        settings = load_settings(args.config, **overrides)
        configure_cli_logging(settings.logging.format)
        command: Command = args.handler
        return command(args, settings)
    except ShardfuseError as exc:
        print(f"shardfuse {args.command}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # A path or address the command was given that the system refuses (a source path that does not exist,
        # a data dir it may not create, a port in use): the user's to fix, so one line rather than a
        # traceback; -v logs the traceback as well.
        logging.getLogger(__name__).debug("shardfuse %s failed", args.command, exc_info=True)
        print(f"shardfuse {args.command}: {os_error_text(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"shardfuse {args.command}: interrupted", file=sys.stderr)
        return 130


def os_error_text(exc: OSError) -> str:
    """``No such file or directory: /proc/x`` for an error about a file, else the error's own message."""
    if exc.strerror and exc.filename is not None:
        return f"{exc.strerror}: {os.fsdecode(exc.filename)}"
    return str(exc) or type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
