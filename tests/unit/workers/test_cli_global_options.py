"""The ``shardfuse`` command line without traps: global options after the command, ``--version``, and the shell
completion scripts (checked by the shells that run them)."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
from pathlib import Path

import pytest

from shardfuse.workers.cli.completion import completion_script
from shardfuse.workers.cli.global_options import subcommand_parsers
from shardfuse.workers.cli.main import build_parser, main


def test_global_options_after_the_command_mean_the_same_as_before_it() -> None:
    parser = build_parser()
    after = parser.parse_args(["search", "q", "--zone", "z", "--config", "F.toml", "-v", "--data-dir", "D"])
    before = parser.parse_args(["--config", "F.toml", "-v", "--data-dir", "D", "search", "q", "--zone", "z"])
    for args in (after, before):
        assert (args.config, args.data_dir, args.verbose) == ("F.toml", "D", True)
        assert (args.zone_names, args.query) == (["z"], "q")
    up = parser.parse_args(["up", "--data-dir", "X"])
    assert (up.command, up.data_dir, up.config, up.verbose) == ("up", "X", None, False)


def test_the_global_option_given_last_wins() -> None:
    parser = build_parser()
    assert parser.parse_args(["--data-dir", "A", "up", "--data-dir", "B"]).data_dir == "B"
    assert parser.parse_args(["--data-dir", "A", "up"]).data_dir == "A"  # not reset by the command's parser


def test_nested_commands_take_them_too() -> None:
    args = build_parser().parse_args(["deadletters", "list", "--data-dir", "D", "-v"])
    assert (args.data_dir, args.verbose) == ("D", True)


def test_every_command_lists_the_global_options_in_its_help() -> None:
    parsers = list(subcommand_parsers(build_parser()))
    assert len(parsers) > 20  # every command, nested ones included
    for parser in parsers:
        text = parser.format_help()
        assert "--data-dir DIR" in text and "--config FILE" in text and "--verbose" in text, parser.prog


def test_a_config_after_the_command_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere.toml"
    assert main(["down", "--data-dir", str(tmp_path), "--config", str(missing)]) == 2
    assert f"config file {missing} does not exist (named by --config)" in capsys.readouterr().err


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"shardfuse {importlib.metadata.version('shardfuse')}"


def test_completion_needs_no_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A broken config must not stop a shell from getting its completion script.
    assert main(["--config", str(tmp_path / "missing.toml"), "completion", "bash"]) == 0
    assert "complete -o bashdefault -F _shtab_shardfuse shardfuse" in capsys.readouterr().out


def _bash_complete(script: Path, words: list[str]) -> list[str]:
    """What bash offers for the last of ``words`` with the completion script sourced."""
    line = " ".join(words)
    program = (f'source "{script}"; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; COMP_LINE="{line}"; '
               'COMP_POINT=${#COMP_LINE}; _shtab_shardfuse; printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run(["bash", "--norc", "--noprofile", "-c", program], capture_output=True, text=True,
                          timeout=30, check=True)
    return [word for word in done.stdout.split() if word]


def test_bash_completion_is_valid_and_completes_commands_and_options(tmp_path: Path) -> None:
    script = tmp_path / "shardfuse.bash"
    script.write_text(completion_script(build_parser(), "bash"))
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    assert _bash_complete(script, ["shardfuse", "se"]) == ["search"]
    assert set(_bash_complete(script, ["shardfuse", "dead"])) == {"deadletters"}
    assert "completion" in _bash_complete(script, ["shardfuse", "co"])
    assert _bash_complete(script, ["shardfuse", "up", "--data"]) == ["--data-dir"]  # after the command too
    assert set(_bash_complete(script, ["shardfuse", "completion", ""])) == {"bash", "zsh", "fish"}


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts_name_every_command(shell: str, tmp_path: Path) -> None:
    script = completion_script(build_parser(), shell)
    for command in ("up", "down", "search", "publish", "deadletters", "completion"):
        assert command in script
    binary = shutil.which(shell)
    if binary is not None:  # the shell itself is the judge, where it is installed
        path = tmp_path / f"shardfuse.{shell}"
        path.write_text(script)
        subprocess.run([binary, "-n", str(path)], check=True, timeout=30)


def test_an_unknown_shell_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["completion", "powershell"])
    assert exited.value.code == 2
    assert "invalid choice: 'powershell'" in capsys.readouterr().err
