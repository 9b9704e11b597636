"""The Dockerfile and .dockerignore, checked without a container engine.

No Docker engine runs here, so the image is never built in tests. What can be checked is: the stages and
their user, that the build's shell steps install torch only for ``LOCAL_EMBEDDER=true`` (the RUN scripts
are run with a stand-in ``pip`` that records its arguments), that everything COPY takes is in the build
context, and that the image's entry point and settings are the ones shardfuse declares.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from tests.support.deployment import check_env, cli_check
from tests.support.paths import REPO

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
COMPILERS = ("build-essential", "gcc", "g++", "clang", "make", "cmake")


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, instruction: str) -> list[str]:
        return [value for name, value in self.instructions if name == instruction]

    @property
    def args(self) -> dict[str, str]:
        return dict(value.split("=", 1) for value in self.values("ARG") if "=" in value)

    @property
    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for value in self.values("ENV"):
            env.update(item.split("=", 1) for item in shlex.split(value))
        return env


def stages(path: Path = DOCKERFILE) -> list[Stage]:
    parsed: list[Stage] = []
    for item in DockerfileParser(path=str(path)).structure:
        instruction, value = item["instruction"], item["value"]
        if instruction == "FROM":
            base, _, name = value.partition(" AS ") if " AS " in value else value.partition(" as ")
            parsed.append(Stage(base=base.strip(), name=name.strip() or None))
        elif instruction != "COMMENT":
            assert parsed, f"{instruction} before the first FROM"
            parsed[-1].instructions.append((instruction, value))
    return parsed


def split_flags(value: str) -> tuple[list[str], list[str]]:
    """``--flag=x --other=y rest…`` → (flags, rest), for RUN, COPY and ADD."""
    words = value.split()
    flags = []
    while words and words[0].startswith("--"):
        flags.append(words.pop(0))
    return flags, words


def run_script(value: str) -> str:
    """The shell script of a RUN (its ``--mount`` … flags removed)."""
    script = value.strip()
    while script.startswith("--"):
        script = script.split(None, 1)[1]
    return script


# -- .dockerignore, with Docker's rules -----------------------------------------------------------------------


def dockerignore_patterns(path: Path = DOCKERIGNORE) -> list[str]:
    lines = [line.strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's (Go filepath.Match plus ``**``) pattern as a regex over a context-relative path."""
    pattern = os.path.normpath(pattern).lstrip("/")
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out.append(pattern[i:end + 1])
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def excluded(relative: str, patterns: list[str]) -> bool:
    """Whether Docker leaves ``relative`` out of the build context: the last pattern that matches it or one
    of its parent folders decides (``!`` patterns put it back)."""
    parts = relative.split("/")
    candidates = ["/".join(parts[:n]) for n in range(len(parts), 0, -1)]
    result = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        regex = _pattern_regex(pattern[1:] if negated else pattern)
        if any(regex.fullmatch(candidate) for candidate in candidates):
            result = not negated
    return result


def test_the_dockerignore_matcher_follows_dockers_rules() -> None:
    patterns = ["tests", "**/__pycache__", "*.egg-info", ".cache", "!.cache/keep/this"]
    assert excluded("tests/unit/test_x.py", patterns)
    assert excluded("pipeline/index/store/__pycache__/rows.cpython-311.pyc", patterns)
    assert excluded("shardfuse.egg-info/PKG-INFO", patterns)
    assert not excluded("pipeline/tests/x.py", patterns)  # no slash: the root only, unlike .gitignore
    assert excluded(".cache/other", patterns) and not excluded(".cache/keep/this", patterns)


# -- stages and user ---------------------------------------------------------------------------------------


def test_multi_stage_build_on_python_311_slim() -> None:
    parsed = stages()
    assert len(parsed) >= 2
    assert all(stage.base == "python:3.11-slim" for stage in parsed)
    final = parsed[-1]
    earlier = {stage.name for stage in parsed[:-1] if stage.name}
    flags = [flag for name, value in final.instructions if name in ("COPY", "RUN") for flag in split_flags(value)[0]]
    assert any(re.search(rf"(?:^|[-,])from={re.escape(name)}(?:,|$)", flag) for flag in flags for name in earlier), \
        "the final stage takes nothing from an earlier stage"


def test_the_final_stage_installs_only_wheels_and_no_compiler() -> None:
    final = stages()[-1]
    for value in final.values("RUN"):
        script = run_script(value)
        assert not any(re.search(rf"(?<![\w-]){re.escape(tool)}(?![\w-])", script) for tool in COMPILERS), script
        for command in re.findall(r"pip install[^;&|]*", script):
            assert "--no-index" in command, f"the final stage installs from an index: {command}"


def test_the_image_runs_as_a_fixed_non_root_user() -> None:
    final = stages()[-1]
    users = final.values("USER")
    assert users, "the final stage sets no USER: the image would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    created = re.search(r"useradd\b[^;&]*--uid (\d+)", " ".join(final.values("RUN")))
    assert created and created.group(1) == user, "USER is not the uid the stage creates"
    assert f"chown {user}:" in " ".join(final.values("RUN")), "the data dir is not the user's"


# -- torch only with LOCAL_EMBEDDER=true ---------------------------------------------------------------------


def run_build_steps(tmp_path: Path, local_embedder: str) -> tuple[int, list[list[str]]]:
    """Run every RUN script that reads LOCAL_EMBEDDER, stage by stage, with the stage's ARG defaults and the
    build arg, a stand-in ``pip`` (records its arguments) and /wheels in a temporary folder."""
    bin_dir, log, wheels = tmp_path / "bin", tmp_path / "pip.log", tmp_path / "wheels"
    bin_dir.mkdir(exist_ok=True)
    wheels.mkdir(exist_ok=True)
    pip = bin_dir / "pip"
    pip.write_text(f'#!/bin/sh\nprintf "%s\\0" "$@" >> {shlex.quote(str(log))}\nprintf "\\n" >> {log}\n')
    pip.chmod(0o755)
    for stage in stages():
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **stage.args, "LOCAL_EMBEDDER": local_embedder}
        for value in stage.values("RUN"):
            if "LOCAL_EMBEDDER" not in value:
                continue
            script = run_script(value).replace("/wheels", str(wheels))
            proc = subprocess.run(["sh", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                                  timeout=30)  # fmt: skip
            if proc.returncode != 0:
                return proc.returncode, []
    calls = [line.split("\0")[:-1] for line in log.read_text().splitlines()] if log.exists() else []
    return 0, calls


def test_without_the_local_embedder_nothing_installs_torch(tmp_path: Path) -> None:
    status, calls = run_build_steps(tmp_path, "false")
    assert status == 0
    assert calls, "no pip command ran"
    assert not any("torch" in " ".join(call) or "[local]" in " ".join(call) for call in calls), calls


def test_the_local_embedder_installs_cpu_torch_first_then_the_local_extra(tmp_path: Path) -> None:
    status, calls = run_build_steps(tmp_path, "true")
    assert status == 0
    torch = [i for i, call in enumerate(calls) if "torch==2.13.0" in call]
    local = [i for i, call in enumerate(calls) if any(arg.endswith("[local]") for arg in call)]
    assert torch and local
    assert min(torch) < min(local), "torch must come first, or the [local] extra pulls the CUDA build"
    builder_torch = calls[min(torch)]
    assert builder_torch[builder_torch.index("--index-url") + 1] == TORCH_CPU_INDEX
    # Both stages end with shardfuse[local]: the builder makes its wheels, the final stage installs them.
    assert [call[0] for call in calls if any(arg.endswith("[local]") for arg in call)] == ["wheel", "install"]


def test_an_unknown_local_embedder_value_fails_the_build(tmp_path: Path) -> None:
    status, _ = run_build_steps(tmp_path, "yes")
    assert status != 0


def test_local_embedder_defaults_to_false_in_every_stage_that_reads_it() -> None:
    for stage in stages():
        if any("LOCAL_EMBEDDER" in value for value in stage.values("RUN")):
            assert stage.args.get("LOCAL_EMBEDDER") == "false", stage.name


# -- the build context ---------------------------------------------------------------------------------------


def copy_sources() -> list[str]:
    sources = []
    for stage in stages():
        for instruction, value in stage.instructions:
            if instruction in ("COPY", "ADD"):
                flags, words = split_flags(value)
                if not any(flag.startswith("--from=") for flag in flags):
                    sources.extend(words[:-1])
    return sources


def test_every_copy_source_is_in_the_build_context() -> None:
    patterns = dockerignore_patterns()
    sources = copy_sources()
    assert sources
    for source in sources:
        path = REPO / source
        assert path.exists(), f"COPY {source}: not in the repository (see the Dockerfile's header for the BPE file)"
        relative = source.rstrip("/")
        assert not excluded(relative, patterns), f"COPY {source}: excluded by .dockerignore"
        if path.is_dir():
            files = [f for f in path.rglob("*.py") if "__pycache__" not in f.parts]
            left_out = [f for f in files if excluded(str(f.relative_to(REPO)), patterns)]
            assert files and not left_out, f"COPY {source}: .dockerignore leaves out {left_out[:3]}"


def test_the_builder_copies_every_package_and_file_the_project_build_needs() -> None:
    # The installed `shardfuse` package is the repository root: its __init__.py and its top-level folders.
    package_dirs = PYPROJECT["tool"]["setuptools"]["package-dir"]
    assert package_dirs == {"shardfuse": "."}
    folders = {name.split(".")[1] for name in PYPROJECT["tool"]["setuptools"]["packages"] if name.count(".") >= 1}
    copied = {source.rstrip("/") for source in copy_sources()}
    assert folders | {"__init__.py"} <= copied
    assert {"pyproject.toml", PYPROJECT["project"]["readme"]} <= copied


def test_dockerignore_keeps_secrets_caches_and_tests_out() -> None:
    patterns = dockerignore_patterns()
    for path in (".env", ".env.local", ".git/HEAD", ".venv/bin/python", "tests/unit/pipeline/storage/test_cas.py",
                 ".pytest_cache/v/cache", ".mypy_cache/3.11/x.json", ".cache/other", "shardfuse.egg-info/PKG-INFO",
                 "pipeline/__pycache__/settings.cpython-311.pyc", "tests/fixtures/x"):  # fmt: skip
        assert excluded(path, patterns), path


# -- entry point, settings, tiktoken ----------------------------------------------------------------------------


def test_entrypoint_is_the_shardfuse_console_script_and_the_default_command_parses() -> None:
    final = stages()[-1]
    entrypoint = json.loads(final.values("ENTRYPOINT")[-1])
    assert entrypoint == ["shardfuse"]
    assert PYPROJECT["project"]["scripts"]["shardfuse"] == "shardfuse.workers.cli.main:main"
    cli_check(json.loads(final.values("CMD")[-1]))


def test_the_image_settings_environment() -> None:
    final = stages()[-1]
    env = final.env
    assert env["SHARDFUSE_DATA_DIR"] == "/var/lib/shardfuse"
    assert env["SHARDFUSE_CONFIG"] == "/etc/shardfuse/shardfuse.toml"
    check_env(env)
    assert json.loads(final.values("VOLUME")[-1]) == [env["SHARDFUSE_DATA_DIR"]]
    assert final.values("WORKDIR")


def test_the_tiktoken_file_is_baked_where_tiktoken_looks_and_checked() -> None:
    final = stages()[-1]
    cache_dir = final.env["TIKTOKEN_CACHE_DIR"]
    cache_name = hashlib.sha1(CL100K_URL.encode()).hexdigest()  # tiktoken's cache file name
    copies = [split_flags(value)[1] for value in final.values("COPY")]
    (source, target), = [(words[0], words[-1]) for words in copies if words[-1].endswith(cache_name)]
    assert target == f"{cache_dir}/{cache_name}"
    digest = hashlib.sha256((REPO / source).read_bytes()).hexdigest()
    checks = [value for value in final.values("RUN") if "sha256sum" in value]
    assert checks and f"{digest}  {target}" in checks[0], "the build does not check the file it bakes in"
    assert "tiktoken.get_encoding('cl100k_base')" in checks[0]  # loaded once at build time, network refused


@pytest.mark.parametrize("name", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_models_are_never_fetched_from_a_hub_at_run_time(name: str) -> None:
    assert stages()[-1].env[name] == "1"
