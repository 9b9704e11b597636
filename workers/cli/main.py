"""``shardfuse``: run the embedded stack, publish, search and watch the index."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from shardfuse.pipeline.config.settings import Settings, load_settings
from shardfuse.pipeline.core.errors import ShardfuseError
from shardfuse.workers.cli import (
    chunks,
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
)
from shardfuse.workers.cli import metrics as exporter_cli
from shardfuse.workers.logs import configure_cli_logging

Command = Callable[[argparse.Namespace, Settings], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardfuse",
        description="Hybrid (BM25 + pgvector) search index kept in step with a content-addressed store.",
    )
    parser.add_argument("--config", metavar="FILE", help="TOML settings file (environment variables still win)")
    parser.add_argument("--data-dir", metavar="DIR", help="where the embedded stack keeps its data")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug output")
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
    except KeyboardInterrupt:
        print(f"shardfuse {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
