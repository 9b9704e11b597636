"""semantic_spans: spans along headings and paragraphs that cover the text, keep to the budget, know their path."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfuse.pipeline.core.token_counting import TokenCounter, TokenOffsets
from shardfuse.pipeline.ingest.chunkers.base import ChunkBudget, Span
from shardfuse.pipeline.ingest.chunkers.semantic import semantic_spans
from tests.support.paths import REPO

COUNTER = TokenCounter()
REAL_FILES = {"README.md": "markdown", "tests/fixtures/markdown/architecture.md": "markdown",
              "pipeline/ingest/chunkers/token_windows.py": "text"}
BUDGETS = (64, 256, 512)
ARCH_TITLE = "shardfuse architecture (living copy)"
MD_HEADING = re.compile(r"#{1,6}(\s|$)")
SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s*$")


def spans_of(text: str, fmt: str, max_tokens: int = 512, overlap: int = 8, title: str | None = None) -> list[Span]:
    budget = ChunkBudget(max_tokens=max_tokens, overlap_tokens=overlap)
    return semantic_spans(text, fmt=fmt, counter=COUNTER, budget=budget, title=title)


def texts(text: str, spans: list[Span]) -> list[str]:
    return [text[s.start : s.end] for s in spans]


def span_with(text: str, spans: list[Span], needle: str) -> Span:
    at = text.index(needle)
    return next(s for s in spans if s.start <= at < s.end)


def at_line_start(text: str, pos: int) -> bool:
    return pos == 0 or text[pos - 1] == "\n"


def at_line_end(text: str, pos: int) -> bool:
    return pos == len(text) or text[pos - 1] == "\n" or text[pos] in "\r\n"


def assert_invariants(text: str, spans: list[Span], max_tokens: int) -> None:
    """Order, coverage of every non-whitespace character, whole lines, the budget, and a count the span
    carries is its text's."""
    assert spans, "text with non-whitespace must give spans"
    covered = 0  # everything before this offset is covered
    for i, span in enumerate(spans):
        assert 0 <= span.start < span.end <= len(text)
        piece = text[span.start : span.end]
        assert COUNTER.count(piece) <= max_tokens
        assert span.tokens is None or span.tokens == COUNTER.count(piece), f"span {i} miscounted"
        if i:
            previous = spans[i - 1]
            assert previous.start < span.start
            if span.start < previous.end:  # only token windows overlap, and they cut a single line
                assert "\n" not in text[previous.start : span.end].rstrip()
        if "\n" in piece.rstrip():  # a span of several lines holds whole lines, or headings and then the first
            assert at_line_start(text, span.start)  # sentences of a line cut at sentence ends
            assert at_line_end(text, span.end) or SENTENCE_END.search(piece), piece
        assert not text[covered : span.start].strip(), f"uncovered text before span {i}"
        covered = max(covered, span.end)
    assert not text[covered:].strip(), "uncovered text after the last span"


def heading_only(piece: str) -> bool:
    lines = [line for line in piece.splitlines() if line.strip()]
    return all(MD_HEADING.match(line) for line in lines)


# --- real files ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_tokens", BUDGETS)
@pytest.mark.parametrize("name", sorted(REAL_FILES))
def test_invariants_on_real_files(name: str, max_tokens: int) -> None:
    text = (REPO / name).read_text(encoding="utf-8")
    assert_invariants(text, spans_of(text, REAL_FILES[name], max_tokens), max_tokens)


@pytest.mark.parametrize("max_tokens", BUDGETS)
@pytest.mark.parametrize("name", ["README.md", "tests/fixtures/markdown/architecture.md"])
def test_real_headings_are_never_alone_when_their_paragraph_fits(name: str, max_tokens: int) -> None:
    text = (REPO / name).read_text(encoding="utf-8")
    spans = spans_of(text, "markdown", max_tokens)
    for span, following in zip(spans, spans[1:], strict=False):
        piece = text[span.start : span.end]
        if heading_only(piece):
            first_paragraph = text[following.start : following.end].split("\n\n")[0]
            assert COUNTER.count(piece + first_paragraph) > max_tokens, f"heading left alone: {piece!r}"


@pytest.mark.parametrize("max_tokens", [256, 512])
def test_heading_path_of_a_known_section(max_tokens: int) -> None:
    text = (REPO / "tests/fixtures/markdown/architecture.md").read_text(encoding="utf-8")
    spans = spans_of(text, "markdown", max_tokens)
    heading = "### How a document's chunks are replaced atomically"
    span = span_with(text, spans, heading)
    assert span.start == text.index(heading)  # the section starts a span
    assert span.heading_path == (ARCH_TITLE, "Shards", "How a document's chunks are replaced atomically")
    # Its first paragraph is in the same span as the heading.
    assert span_with(text, spans, "`ShardStore.apply(changes)` runs one transaction") == span
    assert span_with(text, spans, "## Shards").heading_path == (ARCH_TITLE, "Shards")
    assert spans[0].heading_path == (ARCH_TITLE,)


def test_one_megabyte_of_markdown_keeps_the_invariants() -> None:
    text = (REPO / "tests/fixtures/markdown/architecture.md").read_text(encoding="utf-8") + "\n\n"
    text = text * (1_000_000 // len(text) + 1)
    spans = spans_of(text, "markdown", 256, overlap=32)
    assert spans[0].start == 0 and spans[-1].end == len(text)
    for previous, span in zip(spans, spans[1:], strict=False):
        assert previous.end <= span.start
    for span in spans[:: max(1, len(spans) // 50)]:
        assert COUNTER.count(text[span.start : span.end]) <= 256


# --- Markdown ------------------------------------------------------------------------------------------------

NESTED_MD = """\
Guide
=====

Intro text.

Setup
-----

Install it.

### Linux `apt` ###

Use apt.

#### Debian

Use apt-get.

## Usage

Run it.
"""


def test_markdown_heading_paths_with_setext_and_atx_levels() -> None:
    spans = spans_of(NESTED_MD, "markdown")
    assert_invariants(NESTED_MD, spans, 512)
    assert [s.heading_path for s in spans] == [
        ("Guide",),
        ("Guide", "Setup"),
        ("Guide", "Setup", "Linux `apt`"),
        ("Guide", "Setup", "Linux `apt`", "Debian"),
        ("Guide", "Usage"),
    ]
    # Every section starts its own span, and its heading shares it with the section's paragraph.
    assert [t.strip() for t in texts(NESTED_MD, spans)][2] == "### Linux `apt` ###\n\nUse apt."


def test_given_title_leads_the_path_and_the_first_heading_stays_a_section() -> None:
    spans = spans_of(NESTED_MD, "markdown", title="Handbook")
    assert spans[1].heading_path == ("Handbook", "Guide", "Setup")
    same = spans_of(NESTED_MD, "markdown", title="Guide")
    assert same[1].heading_path == ("Guide", "Setup")


def test_markdown_without_a_level_one_heading_has_no_title() -> None:
    text = "Preface.\n\n## Part\n\nBody.\n"
    assert [s.heading_path for s in spans_of(text, "markdown")] == [(), ("Part",)]


def test_consecutive_headings_share_a_span_with_the_first_paragraph() -> None:
    text = "# Top\n\n## Middle\n\n### Low\n\nThe paragraph.\n\n## Next\n\nMore.\n"
    spans = spans_of(text, "markdown")
    assert texts(text, spans)[0].strip() == "# Top\n\n## Middle\n\n### Low\n\nThe paragraph."
    assert spans[0].heading_path == ("Top", "Middle", "Low")
    assert spans[1].heading_path == ("Top", "Next")


def test_headings_in_fenced_code_are_ignored() -> None:
    text = (
        "# Title\n\nText.\n\n```bash\n# not a heading\necho hi\n\n## nor this\n```\n\n"
        "~~~\n```\n# still code\n~~~\n\n## Real\n\nBody.\n"
    )
    spans = spans_of(text, "markdown")
    assert_invariants(text, spans, 512)
    assert [s.heading_path for s in spans] == [("Title",), ("Title", "Real")]
    assert "# still code" in texts(text, spans)[0]


def test_setext_underline_needs_a_plain_paragraph() -> None:
    text = "# Doc\n\n- a list item\n---\n\nText.\n"
    spans = spans_of(text, "markdown")
    assert [s.heading_path for s in spans] == [("Doc",)]


def test_front_matter_is_not_a_setext_heading() -> None:
    text = "---\ntitle: x\n---\n\n# Real title\n\nBody.\n"
    spans = spans_of(text, "markdown", 16)
    assert spans[-1].heading_path == ("Real title",)
    assert all("title: x" not in part for s in spans for part in s.heading_path)


def test_a_fenced_block_that_fits_is_not_split() -> None:
    code = "\n".join(f"value_{i} = compute({i})\n" if i % 3 == 0 else f"value_{i} = {i}" for i in range(12))
    fence = f"```python\n{code}\n```"
    intro = "Some introduction to the code below. " * 6
    text = f"## Code\n\n{intro}\n\n{fence}\n\nAfter.\n"
    max_tokens = COUNTER.count(fence) + 4
    assert COUNTER.count(f"## Code\n\n{intro}\n\n{fence}") > max_tokens  # so it cannot join the intro
    spans = spans_of(text, "markdown", max_tokens)
    assert_invariants(text, spans, max_tokens)
    assert any(t.startswith(fence) for t in texts(text, spans))  # whole, though it holds blank lines


def test_a_fenced_block_over_the_budget_is_split_at_its_blank_lines() -> None:
    code = "\n\n".join("\n".join(f"    line_{b}_{i} = {i} * {b}" for i in range(4)) for b in range(10))
    text = f"# Doc\n\n```python\n{code}\n```\n"
    spans = spans_of(text, "markdown", 64)
    assert len(spans) > 3
    assert_invariants(text, spans, 64)
    assert all(s.heading_path == ("Doc",) for s in spans)
    assert all(re.match(r"    line_\d+_0 =", t) for t in texts(text, spans)[1:])  # each paragraph fits


def test_small_paragraphs_of_a_section_are_merged() -> None:
    paragraphs = "\n\n".join(f"Paragraph number {i} is short." for i in range(10))
    text = f"# Doc\n\n## One\n\n{paragraphs}\n\n## Two\n\nAlone.\n"
    spans = spans_of(text, "markdown")
    assert len(spans) == 2  # one per section, though both would fit in one
    assert texts(text, spans)[0].strip() == f"# Doc\n\n## One\n\n{paragraphs}"
    assert texts(text, spans)[1].strip() == "## Two\n\nAlone."


def test_merging_stops_at_the_budget() -> None:
    paragraphs = [f"Paragraph {i}: " + "word " * 20 for i in range(12)]
    text = "\n\n".join(paragraphs) + "\n"
    spans = spans_of(text, "markdown", 64)
    assert_invariants(text, spans, 64)
    assert 1 < len(spans) < len(paragraphs)
    for piece in texts(text, spans):  # paragraphs stay whole
        assert all(p.strip().startswith("Paragraph") and p.strip().endswith("word") for p in piece.split("\n\n") if p)


def test_a_heading_is_not_alone_when_its_paragraph_fits() -> None:
    filler = "\n\n".join("Filler sentence that takes some room here." for _ in range(5))
    text = f"## A\n\n{filler}\n\n## B\n\n{'Tight paragraph words. ' * 8}\n"
    max_tokens = COUNTER.count(f"## B\n\n{'Tight paragraph words. ' * 8}\n")
    spans = spans_of(text, "markdown", max_tokens)
    assert_invariants(text, spans, max_tokens)
    assert text[spans[-1].start : spans[-1].end].startswith("## B\n\nTight")
    for piece in texts(text, spans):
        assert not heading_only(piece)


def test_an_oversize_paragraph_is_split_at_lines() -> None:
    lines = [f"Line {i} of a long paragraph without blank lines." for i in range(60)]
    text = "# Doc\n\n" + "\n".join(lines) + "\n"
    spans = spans_of(text, "markdown", 64)
    assert_invariants(text, spans, 64)
    assert len(spans) > 5
    for span in spans:
        assert at_line_start(text, span.start) and at_line_end(text, span.end)
        assert span.heading_path == ("Doc",)


def test_an_oversize_line_is_split_into_token_windows() -> None:
    line = " ".join(f"token{i}" for i in range(600))
    text = f"# Doc\n\nIntro.\n\n{line}\n\nOutro.\n"
    spans = spans_of(text, "markdown", 64, overlap=8)
    assert_invariants(text, spans, 64)
    inside = [s for s in spans if text.index(line) <= s.start < text.index(line) + len(line)]
    assert len(inside) > 5
    assert any(b.start < a.end for a, b in zip(spans, spans[1:], strict=False))  # windows overlap
    assert spans[0].end <= text.index(line) and texts(text, spans)[-1].strip() == "Outro."


# --- reStructuredText ---------------------------------------------------------------------------------------

NESTED_RST = """\
=========
 Manual
=========

Preface text.

Install
=======

Do this.

From source
-----------

Build it.

With options
~~~~~~~~~~~~

Configure.

Uninstall
=========

Remove.

----

After a transition.
"""


def test_rst_levels_follow_the_order_of_adornment_styles() -> None:
    spans = spans_of(NESTED_RST, "rst")
    assert_invariants(NESTED_RST, spans, 512)
    assert [s.heading_path for s in spans] == [
        ("Manual",),
        ("Manual", "Install"),
        ("Manual", "Install", "From source"),
        ("Manual", "Install", "From source", "With options"),
        ("Manual", "Uninstall"),
    ]
    assert texts(NESTED_RST, spans)[1].strip() == "Install\n=======\n\nDo this."


def test_rst_underline_must_be_as_long_as_the_title_and_follow_a_blank_line() -> None:
    text = "Title\n=====\n\nParagraph line\n--------\n\nfirst line\nsecond\n------\n\nText\n----\n\nBody.\n"
    spans = spans_of(text, "rst")
    assert_invariants(text, spans, 512)
    assert [s.heading_path for s in spans] == [("Title",), ("Title", "Text")]
    assert texts(text, spans)[1] == "Text\n----\n\nBody.\n"


# --- HTML ---------------------------------------------------------------------------------------------------

HTML = """\
<html><head><title>Widget &amp; Guide</title></head>
<body>
<h1>Widgets</h1>
<p>Widgets are small.</p>
<h2 class="x">Install <em>now</em></h2>
<p>Run the installer.</p>
<pre>
<h2>not a heading</h2>

<p>still code</p>
</pre>
<h3>Linux</h3>
<ul>
<li>apt</li>
<li>dnf</li>
</ul>
<h2>Use</h2>
<div>Use them.</div>
</body></html>
"""


def test_html_heading_paths_and_title() -> None:
    spans = spans_of(HTML, "html")
    assert_invariants(HTML, spans, 512)
    title = "Widget & Guide"
    assert [s.heading_path for s in spans] == [
        (title,),
        (title, "Widgets"),
        (title, "Widgets", "Install now"),
        (title, "Widgets", "Install now", "Linux"),
        (title, "Widgets", "Use"),
    ]
    install = texts(HTML, spans)[2]
    assert install.startswith('<h2 class="x">') and "<p>still code</p>\n</pre>" in install


def test_html_without_title_takes_the_first_h1() -> None:
    text = re.sub(r"<head>.*</head>", "", HTML)
    spans = spans_of(text, "html")
    assert [s.heading_path for s in spans][:3] == [("Widgets",), ("Widgets",), ("Widgets", "Install now")]
    assert texts(text, spans)[1].startswith("<h1>Widgets</h1>\n<p>")


def test_html_pre_is_kept_whole_and_block_tags_split_when_over_budget() -> None:
    items = "\n".join(f"<li>Item number {i} of the list</li>" for i in range(40))
    text = f"<h2>List</h2>\n<ul>\n{items}\n</ul>\n"
    spans = spans_of(text, "html", 64)
    assert_invariants(text, spans, 64)
    assert len(spans) > 3
    assert all(s.heading_path == ("List",) for s in spans)


# --- plain text and edge cases ------------------------------------------------------------------------------


def test_plain_text_merges_paragraphs_and_has_no_markup_headings() -> None:
    text = "First paragraph,\nof two lines.\n\n# not a heading in text\n\nSecond\nparagraph.\n"
    spans = spans_of(text, "text")
    assert len(spans) == 1 and spans[0].heading_path == ()
    assert spans_of(text, "text", title="notes.txt")[0].heading_path == ("notes.txt",)


def test_a_short_first_line_of_plain_text_is_its_title_for_every_span() -> None:
    body = " ".join(f"Sentence number {i} says something about the topic." for i in range(40))
    text = f"Effects of  caffeine on sleep\n\n{body}\n"
    spans = spans_of(text, "text", 64)
    assert len(spans) > 3
    assert {s.heading_path for s in spans} == {("Effects of caffeine on sleep",)}
    # The title line is not a span of its own: it opens the first sentences.
    assert texts(text, spans)[0].startswith("Effects of  caffeine on sleep\n\nSentence number 0")


@pytest.mark.parametrize("text", [
    "Only one line, nothing after it.\n",
    "A first paragraph\nof two lines.\n\nThen more.\n",
    "x" * 201 + "\n\nThen more.\n",
])
def test_plain_text_without_a_title_line(text: str) -> None:
    assert spans_of(text, "text")[0].heading_path == ()


def test_an_oversize_line_is_cut_at_sentence_ends_and_its_sentences_packed() -> None:
    sentences = [f"Claim {i} holds in {i + 2} of the cases (p < 0.0{i % 9 + 1})." for i in range(60)]
    line = " ".join(sentences)
    text = f"# Doc\n\nIntro paragraph.\n\n{line}\n\nOutro.\n"
    spans = spans_of(text, "markdown", 64, overlap=8)
    assert_invariants(text, spans, 64)
    inside = [s for s in spans if text.index(line) <= s.start < text.index(line) + len(line)]
    assert len(inside) > 3
    assert all(b.start >= a.end for a, b in zip(spans, spans[1:], strict=False))  # no windows: no overlap
    for span in inside:  # each starts at a sentence and ends after one, several sentences a span
        piece = text[span.start : span.end].strip()
        assert piece.startswith("Claim ") and piece.endswith(")."), piece
        assert piece.count("Claim ") > 1
    # The cut line's sentences never share a span with the paragraphs around it (only with headings above).
    assert texts(text, spans)[-1].strip() == "Outro."
    assert not any("Intro" in t and "Claim" in t for t in texts(text, spans))


def test_a_sentence_over_the_budget_falls_back_to_token_windows() -> None:
    line = "Short one. " + " ".join(f"token{i}" for i in range(300)) + ". Another short one."
    spans = spans_of(f"{line}\n", "text", 64, overlap=8)
    assert_invariants(f"{line}\n", spans, 64)
    assert any(b.start < a.end for a, b in zip(spans, spans[1:], strict=False))  # windows overlap


def test_crlf_text_keeps_invariants() -> None:
    text = NESTED_MD.replace("\n", "\r\n")
    spans = spans_of(text, "markdown", 16)
    assert_invariants(text, spans, 16)
    assert spans[1].heading_path == ("Guide", "Setup")


class OtherEncodingCounter(TokenCounter):
    """cl100k under another name: the chunker may not assume how that encoding splits lines."""

    @property
    def encoding_name(self) -> str:
        return "r50k_base"


def test_other_encodings_count_each_span_on_its_own() -> None:
    text = (REPO / "tests/fixtures/markdown/architecture.md").read_text(encoding="utf-8")
    budget = ChunkBudget(max_tokens=128, overlap_tokens=8)
    spans = semantic_spans(text, fmt="markdown", counter=OtherEncodingCounter(), budget=budget)
    assert_invariants(text, spans, 128)
    # Same cuts: cl100k's counts add up at line starts. Only the carried counts differ: summed for cl100k,
    # left to be counted (None) where another encoding's pieces were joined.
    cuts = [(s.start, s.end, s.heading_path) for s in spans]
    assert cuts == [(s.start, s.end, s.heading_path) for s in spans_of(text, "markdown", 128)]
    assert any(s.tokens is None for s in spans)


def test_unknown_format_raises() -> None:
    with pytest.raises(ValueError, match="unknown format"):
        spans_of("text", "pdf")


@pytest.mark.parametrize("fmt", ["markdown", "rst", "html", "text"])
@pytest.mark.parametrize("text", ["", "   ", "\n\n\t \r\n"])
def test_whitespace_only_text_gives_no_spans(fmt: str, text: str) -> None:
    assert spans_of(text, fmt) == []


LINES = ["# H1", "## H2 ##", "Title", "=====", "-----", "```", "~~~", "", "", "words and more words.", "  indented",
         " \r x", "é中文🙂", "<h2>T</h2>", "<pre>", "</pre>", "<!--", "<p>para", "* item", "word " * 80]  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    lines=st.lists(st.sampled_from(LINES), min_size=1, max_size=30),
    newline=st.sampled_from(["\n", "\r\n", "\n\r"]),
    fmt=st.sampled_from(["markdown", "rst", "html", "text"]),
    max_tokens=st.sampled_from([16, 32, 64]),
)
def test_invariants_on_arbitrary_line_mixtures(lines: list[str], newline: str, fmt: str, max_tokens: int) -> None:
    text = newline.join(lines)
    spans = spans_of(text, fmt, max_tokens, overlap=4)
    if text.strip():
        assert_invariants(text, spans, max_tokens)
    else:
        assert spans == []


def test_a_line_cut_at_sentences_gives_spans_of_about_equal_size() -> None:
    # 1.1 budgets of short sentences: greedy filling would give a full span and a scrap of a tenth of one.
    sentences = [f"Item {i} holds." for i in range(100)]
    budget = 64
    count = next(n for n in range(1, 100) if COUNTER.count(" ".join(sentences[:n])) > budget * 1.1)
    line = " ".join(sentences[:count]) + "\n"
    spans = spans_of(line, "text", budget, overlap=0)
    assert_invariants(line, spans, budget)
    sizes = [COUNTER.count(t) for t in texts(line, spans)]
    assert len(sizes) == 2, sizes
    assert min(sizes) >= 0.7 * max(sizes), sizes


class RecordingCounter(TokenCounter):
    """cl100k, remembering the length of every text it encoded with offsets."""

    def __init__(self) -> None:
        super().__init__()
        self.encoded: list[int] = []

    def encode_with_offsets(self, text: str) -> TokenOffsets:
        self.encoded.append(len(text))
        return super().encode_with_offsets(text)


@pytest.mark.parametrize("fmt", ["html", "markdown"])
def test_a_line_cut_into_token_windows_is_encoded_once_with_the_document(fmt: str) -> None:
    # A line with no sentence end over the budget, behind a heading and with multi-byte characters (token
    # boundaries snapped inside characters): its windows read the document's one tokenization, not their own.
    head = "<h1>Page</h1>\n<p>First paragraph.</p>\n" if fmt == "html" else "# Page\n\nFirst paragraph.\n\n"
    text = head + "<h2 é中🙂 word " * 400 + "\n\nLast paragraph.\n"
    counter = RecordingCounter()
    spans = semantic_spans(text, fmt=fmt, counter=counter, budget=ChunkBudget(max_tokens=64, overlap_tokens=8))
    assert_invariants(text, spans, 64)
    assert sum(b.start < a.end for a, b in zip(spans, spans[1:], strict=False)) > 10  # windows overlap
    assert counter.encoded == [len(text)]
