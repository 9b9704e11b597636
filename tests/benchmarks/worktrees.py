"""A baseline revision checked out beside this tree, importable as ``shardfuse`` by a child process: what the A/B
benchmarks (:mod:`tests.benchmarks.query_ab`, :mod:`tests.benchmarks.ingest_ab`) run the old side from."""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def resolve(revision: str) -> str:
    """The commit ``revision`` names; :class:`ValueError` saying why when it names none."""
    try:
        return git("rev-parse", "--verify", f"{revision}^{{commit}}")
    except subprocess.CalledProcessError as exc:
        raise ValueError(f"{revision!r} is not a revision of {REPO}: {exc.stderr.strip()}") from None


def describe_head() -> str:
    """This tree's commit, and whether it has uncommitted changes."""
    return git("rev-parse", "--short", "HEAD") + (" (+ uncommitted changes)" if git("status", "--porcelain") else "")


@dataclass(frozen=True)
class Baseline:
    commit: str
    tree: Path  # the worktree: the baseline's package directory
    pythonpath: str  # a directory holding a link named ``shardfuse`` to ``tree``: put first on PYTHONPATH
    work: Path  # a temporary directory for the caller's files, removed with the worktree


@contextlib.contextmanager
def baseline_worktree(commit: str) -> Iterator[Baseline]:
    """``commit`` checked out into a temporary ``git worktree``, removed on exit. A child process whose
    PYTHONPATH starts with :attr:`Baseline.pythonpath` imports it as ``shardfuse``, ahead of this tree's install."""
    with tempfile.TemporaryDirectory(prefix="shardfuse-ab-") as tmp:
        work = Path(tmp)
        tree = work / "baseline"
        git("worktree", "add", "--detach", str(tree), commit)
        (work / "path").mkdir()
        (work / "path" / "shardfuse").symlink_to(tree, target_is_directory=True)
        try:
            yield Baseline(commit=commit, tree=tree, pythonpath=str(work / "path"), work=work)
        finally:
            git("worktree", "remove", "--force", str(tree))


def ab_command_line(doc: str, *, pairs: int) -> argparse.ArgumentParser:
    """An A/B benchmark's command line: the baseline revision and ``--pairs``; its caller may add more."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("baseline", help="the git revision to compare this working tree against")
    parser.add_argument("--pairs", type=int, default=pairs, help=f"pairs of runs (default {pairs})")
    return parser


def parse_ab(parser: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, str]:
    """The arguments and the baseline's commit; exits with the parser's usage error (before anything starts)
    for ``--pairs`` below 1 or a revision that names no commit."""
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    try:
        return args, resolve(args.baseline)
    except ValueError as exc:
        parser.error(str(exc))
