"""A command given a bad value says so in one line and exits 2, before it stores or sends anything: an
argument no command could use is refused by argparse (ports, counts, timeouts, zone names), and a path or
address the system refuses is reported without a traceback (``-v`` logs the traceback too)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from shardfuse.workers.cli.main import main


@pytest.fixture(autouse=True)
def _own_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A value the commands wrongly took would act on a data dir of the test's own, never on ~/.shardfuse."""
    monkeypatch.setenv("SHARDFUSE_DATA_DIR", str(tmp_path / "own-data"))


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one-line error ``argv`` ends with (exit status 2, no traceback)."""
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's refusal
        status = exc.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(("argv", "says"), [
    (["api", "--port", "99999"], "argument --port: not a TCP port (1 to 65535): 99999"),
    (["exporter", "--port", "0"], "argument --port: not a TCP port (1 to 65535): 0"),
    (["flower", "--port", "70000"], "argument --port: not a TCP port (1 to 65535): 70000"),
    (["exporter", "--port", "http"], "argument --port: invalid port value: 'http'"),
    (["wait", "--timeout", "-1"], "argument --timeout: must be a positive number of seconds, not -1"),
    (["up", "--timeout", "nan"], "argument --timeout: must be a positive number of seconds, not nan"),
    (["deadletters", "list", "--limit", "0"], "argument --limit: must be at least 1, not 0"),
    (["eval-code", "src", "--samples", "-3"], "argument --samples: must be at least 1, not -3"),
    (["worker", "embed", "--concurrency", "0"], "argument --concurrency: must be at least 1, not 0"),
])
def test_a_number_no_command_could_use_is_refused_by_name(argv: list[str], says: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert refused(argv, capsys).endswith(says)


@pytest.mark.parametrize("command", [
    ["publish", "src"], ["delete", "src"], ["watch", "src"], ["reconcile", "src"], ["search", "q"],
    ["explain-chunks", "README.md"], ["reindex", "start", "--model", "default"], ["eval", "data"],
])
@pytest.mark.parametrize("zone", ["", "my zone", "../etc", "-z"])
def test_a_zone_name_no_event_could_carry_is_refused_before_any_file_is_read(
        command: list[str], zone: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused([*command, f"--zone={zone}"], capsys)
    assert f"argument --zone: {zone!r} is not a zone name" in line


def test_publishing_a_path_that_does_not_exist_is_one_line_and_nothing_is_stored(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data_dir = tmp_path / "data"
    # The broker is never reached: the paths are walked before anything is stored or sent.
    line = refused(["publish", str(tmp_path / "typo"), "--zone", "docs", "--data-dir", str(data_dir)], capsys)
    assert line == f"shardfuse publish: {tmp_path / 'typo'} does not exist"
    assert not [p for p in data_dir.rglob("*") if p.is_file()] if data_dir.exists() else True


def test_a_data_dir_that_cannot_be_made_names_the_path_and_the_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    data_dir = tmp_path / "a-file" / "data"
    line = refused(["up", "--data-dir", str(data_dir)], capsys)
    assert line.startswith("shardfuse up: Not a directory: ") and str(tmp_path / "a-file") in line
    assert not caplog.records  # no traceback logged without -v
    with caplog.at_level(logging.DEBUG, logger="shardfuse.workers.cli.main"):
        refused(["up", "--data-dir", str(data_dir), "-v"], capsys)
    assert any(r.exc_info and isinstance(r.exc_info[1], NotADirectoryError) for r in caplog.records)
