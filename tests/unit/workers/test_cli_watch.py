"""``shardfuse watch``: registered, and bad input is refused with a clear message before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardfuse.workers.cli.main import build_parser, main

# No SHARDFUSE_* variable of the shell running the tests, and a HOME of its own (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("isolated_settings_env")


def test_watch_takes_directories_and_a_zone() -> None:
    args = build_parser().parse_args(["watch", "docs", "src", "--zone", "code"])
    assert (args.directories, args.zone) == ([Path("docs"), Path("src")], "code")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["watch", "docs"])  # --zone is required


def test_a_missing_directory_or_a_bad_zone_is_exit_2_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["watch", str(tmp_path / "nowhere"), "--zone", "z"]) == 2
    assert f"shardfuse watch: {tmp_path / 'nowhere'} is not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # argparse refuses the zone before anything is watched
        main(["watch", str(tmp_path), "--zone", "no spaces allowed"])
    assert refused.value.code == 2
    assert "shardfuse watch: error: argument --zone: 'no spaces allowed' is not a zone name" in capsys.readouterr().err
