"""What ``pip install`` puts in a user's environment: the one import name ``shardfuse`` and nothing else.

The repository root is the package (pyproject.toml maps ``shardfuse`` to ``.`` and lists its subpackages
explicitly), so a package folder missing from that list is silently missing from the wheel, and a careless
mapping would install generic names such as ``pipeline`` or ``tests`` into site-packages.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from tests.support.paths import REPO

SUBPACKAGES = ("pipeline", "query", "workers")


def _listed_packages() -> set[str]:
    return set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def _package_dirs() -> dict[str, Path]:
    """Every package folder of the repository, by its installed name."""
    dirs = {"shardfuse": REPO}
    for top in SUBPACKAGES:
        for init in sorted((REPO / top).rglob("__init__.py")):
            relative = init.parent.relative_to(REPO)
            dirs[".".join(("shardfuse", *relative.parts))] = init.parent
    return dirs


def _module_files() -> set[str]:
    """Every module the wheel must carry, as its path inside the wheel."""
    files = {"shardfuse/__init__.py"}
    for top in SUBPACKAGES:
        for module in (REPO / top).rglob("*.py"):
            files.add(str(PurePosixPath("shardfuse", *module.relative_to(REPO).parts)))
    return files


def test_every_package_folder_is_listed_in_pyproject_and_nothing_else() -> None:
    found, listed = set(_package_dirs()), _listed_packages()
    assert found - listed == set(), f"add to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"
    assert listed - found == set(), f"listed in pyproject.toml but no such package folder: {sorted(listed - found)}"


def test_every_folder_with_modules_is_a_package() -> None:
    """A folder of modules without ``__init__.py`` would be left out of the wheel without a word."""
    missing = sorted(str(d.relative_to(REPO)) for top in SUBPACKAGES for d in [REPO / top, *(REPO / top).rglob("*")]
                     if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))
                     and not (d / "__init__.py").exists())
    assert missing == [], f"folders holding modules but no __init__.py: {missing}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    """The wheel pip builds from a copy of the checkout (building in place would leave build/ and
    *.egg-info behind, and a stale build/ can leak deleted modules into the wheel)."""
    source = tmp_path_factory.mktemp("source") / "shardfuse"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".*", "__pycache__", "build", "dist", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(out), str(source)], check=True, timeout=120)
    (built,) = out.glob("shardfuse-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


def test_the_wheel_installs_one_import_name(wheel: zipfile.ZipFile) -> None:
    top = {name.split("/")[0] for name in wheel.namelist()}
    dist_info = {name for name in top if name.startswith("shardfuse-") and name.endswith(".dist-info")}
    assert len(dist_info) == 1 and top - dist_info == {"shardfuse"}, sorted(top)


def test_the_wheel_holds_every_module_and_no_tests(wheel: zipfile.ZipFile) -> None:
    modules = {name for name in wheel.namelist() if name.endswith(".py")}
    expected = _module_files()
    assert {"shardfuse/__init__.py", "shardfuse/pipeline/__init__.py", "shardfuse/query/__init__.py",
            "shardfuse/workers/cli/main.py"} <= expected
    assert expected - modules == set(), f"modules missing from the wheel: {sorted(expected - modules)}"
    assert modules - expected == set(), f"unexpected files in the wheel: {sorted(modules - expected)}"
    assert not any(name.startswith(("shardfuse/tests/", "pipeline/", "tests/")) for name in wheel.namelist())


def test_the_wheel_installs_the_command(wheel: zipfile.ZipFile) -> None:
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry_points).decode()
    assert "[console_scripts]" in text and "shardfuse = shardfuse.workers.cli.main:main" in text
