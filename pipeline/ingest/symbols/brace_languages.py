"""Per brace language: which text is a string or comment, and which lines open a definition."""

from __future__ import annotations

import re

from shardfuse.pipeline.ingest.symbols.braces import BraceLanguage
from shardfuse.pipeline.ingest.symbols.braces import header as _h
from shardfuse.pipeline.ingest.symbols.header_tails import Tail
from shardfuse.pipeline.ingest.symbols.model import Kind


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.MULTILINE)


# Comments and strings per family. Unterminated single-line strings run to the line end, block comments
# and multi-line strings to the chunk's end.
_SLASH_COMMENTS = r"//[^\n]*|/\*[\s\S]*?(?:\*/|\Z)"
_QUOTED = r"\"(?:\\.|[^\"\\\n])*\"?|'(?:\\.|[^'\\\n])*'?"
_JS_LITERALS = _rx(_SLASH_COMMENTS + r"|`(?:\\[\s\S]|[^`\\])*`?|" + _QUOTED)
_GO_LITERALS = _rx(_SLASH_COMMENTS + r"|`[^`]*`?|" + _QUOTED)
_RUST_LITERALS = _rx(
    _SLASH_COMMENTS + r"|\br(#*)\"[\s\S]*?(?:\"\1|\Z)|b?\"(?:\\[\s\S]|[^\"\\])*\"?"
    # Char literals are one character or escape, so a lifetime ('a) is not taken for one.
    r"|b?'(?:\\(?:u\{[0-9a-fA-F]{1,6}\}|x[0-9a-fA-F]{2}|.)|[^'\\\n])'"
)
_JVM_LITERALS = _rx(_SLASH_COMMENTS + r"|\"\"\"[\s\S]*?(?:\"\"\"|\Z)|@\"(?:\"\"|[^\"])*\"?|" + _QUOTED)
_C_LITERALS = _rx(
    _SLASH_COMMENTS + r"|^[ \t]*#(?:\\[\s\S]|[^\n\\])*|\bR\"([^(\s]*)\([\s\S]*?(?:\)\1\"|\Z)|" + _QUOTED
)

_ID = r"[A-Za-z_$][\w$]*"
# One level of nested brackets is enough for parameter lists in practice (defaults, annotations).
_PARAMS = r"\((?:[^(){};]|\([^(){};]*\)|\{[^(){};]*\})*\)"
# Modifiers and a return type, possibly over several lines; bounded, so that a long run of words (an enum's
# values) is not rescanned from every line.
_TYPE_WORDS = r"(?:[\w$:<>,.?*&~\[\]]+\s++){1,8}[*&]*"
_RUST_VIS = r"(?:pub(?:\([^)\n]*\))?\s++)?"
_UPPER = r"_?[A-Z][A-Z0-9_]*"
# Lower-case modifiers before a keyword (`public static final class`); bounded, like _TYPE_WORDS, so that a
# run of lower-case words over many lines is not rescanned from each of them.
_MODIFIERS = r"(?:[a-z]+\s++){0,12}"
# What may come between a Rust `impl` and its self type, or a C++ `template` and its class (bounded: see
# _MODIFIERS; real headers are far shorter).
_SPAN = 256


_JS_HEADERS = (
    _h(
        rf"^[ \t]*+(?:export\s++)?(?:default\s++)?(?:async\s++)?function\b\s*+(?:\*\s*+)?(?P<name>{_ID})",
        Kind.CALLABLE,
    ),
    _h(
        r"^[ \t]*+(?:export\s++)?(?:default\s++)?(?:declare\s++)?(?:abstract\s++)?"
        rf"(?:class|interface|(?:const\s++)?enum)\s++(?P<name>{_ID})",
        Kind.TYPE,
    ),
    _h(
        rf"^[ \t]*+(?:export\s++)?(?:const|let|var)\s++(?P<name>{_ID})\s*+(?::[^=\n]+)?=\s*+(?:async\s++)?"
        rf"(?:function\b|(?:\((?:[^()]|\([^()]*\))*\)|{_ID})\s*+(?::[^=\n]+)?=>)",
        Kind.CALLABLE,
        statement=True,
    ),
    _h(rf"^(?:export\s++)?(?:declare\s++)?type\s++(?P<name>{_ID})\s*+(?:<[^=\n]*>)?\s*+=", Kind.TYPE, statement=True),
    _h(rf"^(?:export\s++)?const\s++(?P<name>{_UPPER})\b\s*+(?::[^=\n]+)?=(?!=)", Kind.CONSTANT, statement=True),
    # Methods (class bodies, object literals): indented, a parameter list, then a body.
    _h(
        r"^[ \t]++(?:(?:static|async|get|set|public|private|protected|readonly|override|abstract)\s++)*(?:\*\s*+)?"
        rf"(?P<name>#?{_ID})\s*+(?:<[^<>()\n]*>)?\s*+{_PARAMS}\s*+(?::\s*+[^{{}};=()]+)?\{{",
        Kind.CALLABLE,
    ),
)

_GO_HEADERS = (
    _h(r"^func\s*+(?:\([^()]*\)\s*+)?(?P<name>[A-Za-z_]\w*)", Kind.CALLABLE),
    _h(r"^type\s++(?P<name>[A-Za-z_]\w*)\b", Kind.TYPE, statement=True),
    _h(r"^const\s++(?P<name>[A-Za-z_]\w*)\b", Kind.CONSTANT, statement=True),
)

_RUST_HEADERS = (
    _h(
        rf"^[ \t]*+{_RUST_VIS}(?:(?:const|async|unsafe|default|extern)\s++)*fn\s++(?P<name>[A-Za-z_]\w*)",
        Kind.CALLABLE,
    ),
    _h(rf"^[ \t]*+{_RUST_VIS}(?:struct|enum|trait|union)\s++(?P<name>[A-Za-z_]\w*)", Kind.TYPE),
    # An impl is named after its self type: `impl<T> fmt::Display for Wrapper<T>` defines Wrapper's methods.
    _h(
        rf"^[ \t]*+(?:unsafe\s++)?impl\b(?:\s*+<[^{{;]{{0,{_SPAN}}}?>)?\s++(?:[^{{;]{{0,{_SPAN}}}?\s++for\s++)?"
        r"(?:&\s*+)?(?:dyn\s++)?"
        r"(?:[A-Za-z_]\w*::)*(?P<name>[A-Za-z_]\w*)",
        Kind.TYPE,
    ),
    _h(rf"^[ \t]*+{_RUST_VIS}type\s++(?P<name>[A-Za-z_]\w*)", Kind.TYPE, statement=True),
    _h(rf"^[ \t]*+{_RUST_VIS}(?:const|static)\s++(?:mut\s++)?(?P<name>{_UPPER})\s*+:", Kind.CONSTANT,
       statement=True),
)

_JVM_CLASS = _h(
    rf"^[ \t]*+{_MODIFIERS}(?:class|interface|enum|struct|record|object|@interface)\s++(?P<name>{_ID})", Kind.TYPE
)
_JAVA_HEADERS = (
    _JVM_CLASS,
    # A method: annotations, modifiers and a return type, a name, parameters, `throws`, then a body, a `;`
    # (abstract and interface methods) or `=>` (C# expression bodies).
    _h(
        rf"^[ \t]*+(?:@\w+(?:\([^()\n]*\))?\s++)*+{_TYPE_WORDS}(?P<name>{_ID})\s*+{_PARAMS}",
        Kind.CALLABLE,
        tail=Tail.BODY_OR_DECLARATION,  # then code up to "{", ";" or "=>"
    ),
    _h(
        rf"^[ \t]*+{_MODIFIERS}(?:static\s++final|final\s++static|const)\s++[\w<>\[\],.?]+\s++"
        rf"(?P<name>{_ID})\s*+=(?!=)",
        Kind.CONSTANT,
        statement=True,
    ),
)
_KOTLIN_HEADERS = (
    _JVM_CLASS,
    _h(
        rf"^[ \t]*+{_MODIFIERS}fun\s++(?:<[^>\n]*>\s*+)?(?:[\w.]+\.)?(?P<name>{_ID})",
        Kind.CALLABLE,
    ),
    _h(rf"^[ \t]*+(?:[a-z]+\s++)*const\s++val\s++(?P<name>{_ID})", Kind.CONSTANT, statement=True),
)
_CPP_HEADERS = (
    # Only definitions with a body: `class Foo;` and `struct foo *f()` are not definitions of Foo/foo.
    _h(
        rf"^[ \t]*+(?:template\s*+<[^;{{}}]{{0,{_SPAN}}}>\s*+)?(?:typedef\s++)?"
        r"(?:class|struct|union|enum(?:\s++class)?)\s++(?:[A-Za-z_]\w*\s++)?(?P<name>[A-Za-z_]\w*)",
        Kind.TYPE,
        tail=Tail.BASES_THEN_BODY,  # followed by `final`, `: bases`, then "{"
    ),
    _h(
        rf"^[ \t]*+{_TYPE_WORDS}(?:[A-Za-z_]\w*(?:<[^<>;{{}}()]*>)?::)*(?P<name>~?[A-Za-z_]\w*)\s*+{_PARAMS}",
        Kind.CALLABLE,
        tail=Tail.BODY,  # then code up to its body's "{"
    ),
    _h(
        r"^(?:static\s++)?(?:constexpr|const)\s++[\w:<>]+\s++(?P<name>[A-Za-z_]\w*)\s*+(?:\[[^\]]*\])?\s*+=(?!=)",
        Kind.CONSTANT,
        statement=True,
    ),
)

JS = BraceLanguage(_JS_LITERALS, _JS_HEADERS)
JVM = BraceLanguage(_JVM_LITERALS, _JAVA_HEADERS)
CPP = BraceLanguage(_C_LITERALS, _CPP_HEADERS)
GO = BraceLanguage(_GO_LITERALS, _GO_HEADERS)
RUST = BraceLanguage(_RUST_LITERALS, _RUST_HEADERS)
KOTLIN = BraceLanguage(_JVM_LITERALS, _KOTLIN_HEADERS)
