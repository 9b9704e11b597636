"""decode_content: text comes back exactly as stored; anything else is skipped with an actionable reason."""

from __future__ import annotations

import codecs

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardfuse.pipeline.ingest.decode import Decoded, Skipped, decode_content

LIMIT = 10 * 1024 * 1024


def test_utf8_without_bom_is_kept_exactly() -> None:
    text = "def f():\r\n    return 'naïve 👍'\r\n"
    assert decode_content(text.encode(), max_bytes=LIMIT) == Decoded(text=text, encoding="utf-8", bom=False)


def test_utf8_bom_is_stripped() -> None:
    result = decode_content(codecs.BOM_UTF8 + "héllo".encode(), max_bytes=LIMIT)
    assert result == Decoded(text="héllo", encoding="utf-8", bom=True)


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"])
def test_utf16_and_utf32_with_bom(codec: str) -> None:
    text = "line one\nline two 日本 🧑‍🚀\n"
    result = decode_content("\ufeff".encode(codec) + text.encode(codec), max_bytes=LIMIT)
    assert result == Decoded(text=text, encoding=codec, bom=True)


def test_python_utf16_codec_output_is_accepted() -> None:
    # str.encode("utf-16") writes a BOM in the machine's byte order.
    result = decode_content("abc\n".encode("utf-16"), max_bytes=LIMIT)
    assert isinstance(result, Decoded) and result.text == "abc\n"


def test_empty_file() -> None:
    assert decode_content(b"", max_bytes=LIMIT) == Skipped("empty file")


def test_bom_only_file_is_empty() -> None:
    result = decode_content(codecs.BOM_UTF8, max_bytes=LIMIT)
    assert isinstance(result, Skipped) and result.reason.startswith("empty file")


def test_too_large() -> None:
    result = decode_content(b"x" * 12_000_000, max_bytes=LIMIT)
    assert result == Skipped("too large: 12,000,000 bytes > limit 10,485,760")


def test_exactly_at_the_limit_is_fine() -> None:
    assert isinstance(decode_content(b"x" * 100, max_bytes=100), Decoded)
    assert isinstance(decode_content(b"x" * 101, max_bytes=100), Skipped)


def test_nul_byte_means_binary() -> None:
    data = b"a" * 123 + b"\x00" + b"b" * 10
    assert decode_content(data, max_bytes=LIMIT) == Skipped("binary content (NUL byte at offset 123)")


def test_png_is_binary() -> None:
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4
    result = decode_content(png, max_bytes=LIMIT)
    assert isinstance(result, Skipped) and result.reason.startswith("binary content (NUL byte at offset 8)")


def test_many_control_characters_mean_binary() -> None:
    data = (b"ab\x01\x02\x03\x04" * 2000) + b"tail"
    result = decode_content(data, max_bytes=LIMIT)
    assert isinstance(result, Skipped)
    assert result.reason == (
        "binary content (5,460 of the first 8,192 bytes are control characters, more than 10%)"
    )


def test_text_controls_do_not_count_as_binary() -> None:
    text = "\x1b[31mred\x1b[0m\tcol\x0c\x0b\r\n" * 500
    assert decode_content(text.encode(), max_bytes=LIMIT) == Decoded(text=text, encoding="utf-8", bom=False)


def test_invalid_utf8_names_the_byte_and_offset() -> None:
    data = b"a" * 42 + b"\xff" + b"rest"
    assert decode_content(data, max_bytes=LIMIT) == Skipped("not valid UTF-8 (invalid byte 0xff at offset 42)")


def test_latin1_is_not_guessed() -> None:
    result = decode_content("café".encode("latin-1"), max_bytes=LIMIT)
    assert result == Skipped("not valid UTF-8 (invalid byte 0xe9 at offset 3)")


def test_broken_utf16_after_bom() -> None:
    # A lone high surrogate (D800) cannot be decoded.
    result = decode_content(codecs.BOM_UTF16_LE + b"a\x00\x00\xd8b\x00", max_bytes=LIMIT)
    assert isinstance(result, Skipped)
    assert result.reason.startswith("not valid UTF-16-LE despite its byte-order mark")
    assert "byte offset 4" in result.reason


def test_nul_inside_utf16_text_is_binary() -> None:
    data = "\ufeffab\x00cd".encode("utf-16-le")
    result = decode_content(data, max_bytes=LIMIT)
    assert isinstance(result, Skipped) and result.reason.startswith("binary content (NUL character at")


def test_line_count_counts_newlines() -> None:
    def lines(text: str) -> int:
        result = decode_content(text.encode(), max_bytes=LIMIT)
        assert isinstance(result, Decoded)
        return result.line_count

    assert lines("a") == 1
    assert lines("a\nb") == 2
    assert lines("a\nb\n") == 2
    assert lines("a\r\nb\r\n") == 2
    assert lines("a\rb") == 1
    assert lines("\n\n") == 2


def test_rejects_non_positive_limit() -> None:
    with pytest.raises(ValueError):
        decode_content(b"x", max_bytes=0)


# Text a person would store: no NUL, no control characters but those text uses (tab, newlines, FF, VT,
# ESC), and no lone surrogates (UTF-8 cannot encode them).
plain_text = st.text(
    st.one_of(st.characters(blacklist_categories=("Cs", "Cc")), st.sampled_from("\t\n\r\x0b\x0c\x1b")),
    min_size=1,
)


@given(text=plain_text)
def test_utf8_round_trips(text: str) -> None:
    assert decode_content(text.encode(), max_bytes=LIMIT) == Decoded(text=text, encoding="utf-8", bom=False)


@given(data=st.binary(max_size=300))
def test_any_bytes_give_a_result_never_an_exception(data: bytes) -> None:
    result = decode_content(data, max_bytes=LIMIT)
    if isinstance(result, Decoded):
        assert "\x00" not in result.text
    else:
        assert result.reason
