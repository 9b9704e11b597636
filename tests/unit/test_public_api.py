"""The installed package's shape: one import name, a small public API at the top, and domain packages that
never pull in Celery."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

import shardfuse
from tests.support.paths import REPO

DOMAIN = ("pipeline", "query")


@pytest.mark.parametrize("name", shardfuse.__all__)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(shardfuse, name) is not None


def test_what_a_search_raises_can_be_caught_from_the_top() -> None:
    import fakeredis

    from shardfuse.workers import replies

    client, address = fakeredis.FakeRedis(), replies.new_address()
    refused = replies.failure(shardfuse.InvalidQueryError("k must be at least 1"))
    broken = replies.failure(ZeroDivisionError("division by zero"))
    for payload, kind in ((refused, shardfuse.InvalidQueryError), (broken, shardfuse.RemoteSearchError)):
        replies.send(client, address, payload)
        with pytest.raises(kind) as caught:
            replies.wait(client, address, 1.0)
        assert isinstance(caught.value, shardfuse.ShardfuseError)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = shardfuse.Nope  # type: ignore[attr-defined]


def test_the_readme_example_names_are_public() -> None:
    from shardfuse import SearchClient, connect_publisher, load_settings

    assert callable(SearchClient) and callable(connect_publisher) and callable(load_settings)


def test_importing_the_package_and_its_domain_loads_no_celery() -> None:
    """The public API is imported on first use, so a program that only publishes events or reads settings
    does not pay for Celery, and the domain packages stay usable without it."""
    code = ("import sys, shardfuse, shardfuse.pipeline.core.events, shardfuse.pipeline.config.settings, "
            "shardfuse.query.fusion; print(sorted(m for m in sys.modules if m.split('.')[0] in ('celery', 'kombu')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]"


def _imports(path: str) -> set[str]:
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", DOMAIN)
def test_domain_packages_never_import_celery_or_the_worker_layer(package: str) -> None:
    offenders = {}
    for module in sorted((REPO / package).rglob("*.py")):
        relative = str(module.relative_to(REPO))
        bad = {name for name in _imports(relative)
               if name.split(".")[0] in ("celery", "kombu") or name.startswith("shardfuse.workers")}
        if bad:
            offenders[relative] = sorted(bad)
    assert offenders == {}


def test_code_imports_itself_only_as_shardfuse() -> None:
    """Inside a checkout the folders are importable by their bare names too; importing one that way would
    load a second copy of its modules next to the shardfuse.* one."""
    offenders = {}
    for top in ("pipeline", "query", "workers", "tests"):
        for module in sorted((REPO / top).rglob("*.py")):
            relative = str(module.relative_to(REPO))
            bad = {name for name in _imports(relative) if name.split(".")[0] in ("pipeline", "query", "workers")}
            if bad:
                offenders[relative] = sorted(bad)
    assert offenders == {}


def test_no_module_over_300_lines() -> None:
    """A module a reader can hold in mind: past 300 lines, split it by what it holds."""
    sizes = {str(path.relative_to(REPO)): len(path.read_text(encoding="utf-8").splitlines())
             for top in ("pipeline", "query", "workers") for path in (REPO / top).rglob("*.py")}
    assert {path: lines for path, lines in sizes.items() if lines > 300} == {}
