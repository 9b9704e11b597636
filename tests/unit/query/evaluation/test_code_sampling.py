from __future__ import annotations

import textwrap

import pytest

from shardfuse.query.evaluation.code_sampling import (
    CodeDefinition,
    find_definitions,
    first_sentence,
    sample_cases,
    strip_name,
    unique_definitions,
)

SOURCE = textwrap.dedent('''\
    """A module."""
    import functools


    @functools.cache
    def parse_event(raw):
        """Parse one event from the wire. Raises on garbage."""
        return raw


    class Broker:
        """Moves messages."""

        def __init__(self):
            pass

        async def publish(self, message):
            """Send ``message`` to the exchange, e.g. the default one."""

            def encode():
                return message

            return encode()


    if True:
        def guarded():
            pass
    ''')


def test_every_definition_is_found_with_its_def_line_qualified_name_and_kind() -> None:
    found = {d.qualified: d for d in find_definitions("pkg/mod.py", SOURCE)}
    assert set(found) == {"parse_event", "Broker", "Broker.__init__", "Broker.publish", "Broker.publish.encode",
                          "guarded"}
    # The def line, not the decorator's.
    assert (found["parse_event"].line, found["parse_event"].end_line) == (6, 8)
    assert found["Broker"].kind == "class"
    assert found["Broker.publish"].kind == "method"
    assert found["Broker.publish.encode"].kind == "function"
    assert found["guarded"].line == 27  # under an ``if``
    assert found["parse_event"].summary == "Parse one event from the wire."
    assert found["Broker.__init__"].summary == ""
    assert all(d.path == "pkg/mod.py" for d in found.values())


def test_a_file_that_does_not_parse_defines_nothing() -> None:
    assert find_definitions("bad.py", "def broken(:\n") == []


def test_only_names_defined_once_and_no_dunders_are_asked_for() -> None:
    definitions = [
        *find_definitions("a.py", SOURCE),
        *find_definitions("b.py", "def guarded():\n    pass\n\nclass Other:\n    def __init__(self): pass\n"),
    ]
    names = {d.name for d in unique_definitions(definitions)}
    assert names == {"parse_event", "Broker", "publish", "encode", "Other"}  # guarded is defined twice


def test_docstring_cases_are_functions_with_a_distinct_sentence_and_the_name_removed() -> None:
    definitions = [
        _definition("load_config", "Read load_config() settings from the TOML file.", line=1),
        _definition("Loader", "A class, so not asked by docstring.", kind="class", line=10),
        _definition("first", "Deprecated alias kept for callers.", line=20),
        _definition("second", "Deprecated alias kept for callers.", line=30),  # the same sentence: ambiguous
        _definition("tiny", "Do tiny.", line=40),  # one word left once the name is gone
    ]
    cases = sample_cases(definitions, n=10, seed=1)
    by_kind = {(c.kind, c.target.name): c.query for c in cases}
    assert by_kind[("docstring", "load_config")] == "Read settings from the TOML file."
    assert {name for kind, name in by_kind if kind == "docstring"} == {"load_config"}
    assert {name for kind, name in by_kind if kind == "name"} == {"load_config", "Loader", "first", "second", "tiny"}
    assert by_kind[("name", "tiny")] == "tiny"


def test_the_sample_is_seeded_capped_and_sorted_by_place() -> None:
    definitions = [_definition(f"name_{i:03d}", f"Compute value number {i} here.", line=i) for i in range(1, 300)]
    first = sample_cases(definitions, n=50, seed=7)
    assert first == sample_cases(list(reversed(definitions)), n=50, seed=7)
    assert sum(c.kind == "name" for c in first) == 50
    assert sum(c.kind == "docstring" for c in first) == 50
    names = [c.target.line for c in first if c.kind == "name"]
    assert names == sorted(names)
    assert first != sample_cases(definitions, n=50, seed=8)


@pytest.mark.parametrize(
    ("sentence", "name", "parts", "expected"),
    [
        ("Return the apply_async options.", "apply_async", False, "Return the options."),
        ("Call ``Task.apply_async()`` later.", "apply_async", False, "Call later."),
        ("See :meth:`~celery.Task.apply_async` for details.", "apply_async", False, "See for details."),
        ("APPLY_ASYNC is not apply_asyncs.", "apply_async", False, "is not apply_asyncs."),  # whole words only
        ("Apply the task asynchronously.", "apply_async", False, "Apply the task asynchronously."),
        ("Apply the task async, apply_async-style.", "apply_async", True, "the task , -style."),
        ("Parse an HTTPServer reply.", "HTTPServer", True, "Parse an reply."),
    ],
)
def test_strip_name(sentence: str, name: str, parts: bool, expected: str) -> None:
    assert strip_name(sentence, name, parts=parts) == expected


@pytest.mark.parametrize(
    ("docstring", "expected"),
    [
        ("Parse one event. Then more.", "Parse one event."),
        ("Use a default, e.g. the first one. More.", "Use a default, e.g. the first one."),
        ("A summary without a stop\n\nDetails follow.", "A summary without a stop"),
        ("Spread over\n    two lines.  Next.", "Spread over two lines."),
        ("Version 2.0 is out", "Version 2.0 is out"),
        ("", ""),
    ],
)
def test_first_sentence(docstring: str, expected: str) -> None:
    assert first_sentence(docstring) == expected


def _definition(name: str, summary: str, *, kind: str = "function", line: int) -> CodeDefinition:
    return CodeDefinition(path="m.py", name=name, qualified=name, kind=kind, line=line, end_line=line + 2,
                          summary=summary)
