"""clean_text and is_blank: examples of every rule, and the character sets re-derived from
Unicode. Properties over generated text are in test_cleaning_properties.py."""

from __future__ import annotations

import pickle  # noqa: TID251 -- checks the error survives the process boundary Dagster pickles it across
import re
import sys
import unicodedata

import pytest

from aieng_core.data import cleaning
from aieng_core.data.cleaning import ExcessiveCombiningMarks, check_combining_marks, clean_text, is_blank

ALL_CHARS = [chr(cp) for cp in range(sys.maxunicode + 1)]
ALL_TEXT = "".join(ALL_CHARS)  # every code point once: pattern.findall(ALL_TEXT) is the set a class matches

# Default_Ignorable_Code_Point, from Unicode's DerivedCoreProperties.txt (unicodedata lacks it).
DEFAULT_IGNORABLE = [
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F),
    (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
]  # fmt: skip


@pytest.mark.parametrize(
    "raw, expected",
    [
        # line breaks become \n, "\r\n" as one
        ("line\r\nbreak", "line\nbreak"),
        ("line\rnext", "line\nnext"),
        ("a\r\n\r\nb", "a\n\nb"),
        ("a\n\rb", "a\n\nb"),  # "\n\r" is two line breaks, not one
        ("a\x0bb\x0cc", "a\nb\nc"),  # vertical tab and form feed
        ("c1\x85chars", "c1\nchars"),  # NEL
        ("a\u2028b", "a\nb"),  # line separator
        ("a\u2029b", "a\nb"),  # paragraph separator
        ("中文\u2028文本", "中文\n文本"),
        # the other separators become a space
        ("a\x1cb", "a b"),
        ("a\x1d\x1e\x1fb", "a b"),
        ("中\x1f文", "中 文"),
        # other control characters go, except \n and \t (which becomes a space)
        ("a\x00b", "ab"),
        ("a\x07b\x1bc", "abc"),
        ("del\x7fete", "delete"),
        ("c1\x9fchars", "c1chars"),
        ("é\x00\x9f", "é"),
        ("a\tb", "a b"),
        ("a\t\t b", "a b"),
        # NFC
        ("e\u0301t\u00e9", "\u00e9t\u00e9"),
        ("\u212b", "\u00c5"),  # ANGSTROM SIGN -> A WITH RING
        ("\u1100\u1161", "\uac00"),  # Hangul jamo compose
        ("e\x00\u0301", "\u00e9"),  # a control character does not block composition
        ("o\u0323\u0302", "\u1ed9"),  # canonical reordering then composition
        ("a" + "\u0301" * 30, "\u00e1" + "\u0301" * 29),  # 30 combining marks in a row are allowed
        # whitespace runs -> one space, newlines untouched
        ("a  b", "a b"),
        ("a\u00a0b", "a b"),  # NBSP
        ("a\u3000\u3000b", "a b"),  # ideographic space
        ("a \u202f\u205f\u1680 b", "a b"),
        ("a\u2000b\u200ac", "a b c"),
        ("中文\u3000文本", "中文 文本"),
        ("a\u200bb", "a\u200bb"),  # ZERO WIDTH SPACE is not whitespace (category Cf)
        ("a\nb", "a\nb"),
        ("a  \n \t b", "a \n b"),
        ("a\n\nb", "a\n\nb"),
        # a line of only whitespace is blank
        ("a\n \nb", "a\n\nb"),
        ("a\n \n\t\n \nb", "a\n\nb"),
        ("a\n\u3000\u00a0\nb", "a\n\nb"),
        ("a\n\x0c\nb", "a\n\nb"),
        ("a\r\n \r\n\r\nb", "a\n\nb"),
        ("a\n \n b", "a\n\n b"),  # a line with text keeps its leading space
        # 3+ newlines -> 2
        ("a\n\n\nb", "a\n\nb"),
        ("a\n\n\n\n\n\n\nb", "a\n\nb"),
        ("a\n\n\n\nb\n\n\nc", "a\n\nb\n\nc"),
        # strip
        ("  \n hello world \n\n ", "hello world"),
        ("\u3000\u00a0text\u2028", "text"),
        # nothing left
        ("", ""),
        (" \t\x07 \n ", ""),
        ("\x00\x01\x02", ""),
        ("\n\n\n\n", ""),
        ("\x1c\u2028\x0b", ""),
        # already clean text is unchanged
        ("Hello, world.\n\nSecond paragraph.", "Hello, world.\n\nSecond paragraph."),
    ],
)
def test_clean_text_examples(raw: str, expected: str) -> None:
    assert clean_text(raw) == expected


def test_other_whitespace_is_exactly_isspace_minus_newline_and_space() -> None:
    derived = {c for c in ALL_CHARS if c.isspace()} - {"\n", " "}
    assert cleaning._OTHER_WHITESPACE == frozenset(derived)
    assert set(cleaning._OTHER_WHITESPACE_CHAR.findall(ALL_TEXT)) == derived


def test_control_pattern_is_exactly_category_cc_minus_newline_and_tab() -> None:
    derived = {chr(cp) for cp in range(0x10000) if unicodedata.category(chr(cp)) == "Cc"} - {"\n", "\t"}
    matched = {chr(cp) for cp in range(0x10000) if cleaning._CONTROL.match(chr(cp))}
    assert matched == derived
    assert {chr(cp) for cp in range(0x10000) if cleaning._CONTROL_OR_LINE_BREAK.match(chr(cp))} == derived | {
        "\u2028",
        "\u2029",
    }


def test_ascii_tables_follow_the_rules() -> None:
    for code in range(128):
        data = bytes([code])
        expected = cleaning._SEPARATOR.sub(" ", cleaning._LINE_BREAK.sub("\n", data.decode()))
        expected = cleaning._CONTROL.sub("", expected)
        assert data.translate(cleaning._ASCII_BREAKS_AND_SEPARATORS, cleaning._ASCII_DELETED).decode() == expected


# ---- combining marks --------------------------------------------------------------------
def test_non_starter_class_is_exactly_the_characters_decomposing_to_a_combining_mark_first() -> None:
    marks = {c for c in ALL_CHARS if unicodedata.combining(c)}
    decomposing = [c for c in ALL_CHARS if unicodedata.decomposition(c) and c not in marks]
    derived = marks | {c for c in decomposing if unicodedata.combining(unicodedata.normalize("NFD", c)[0])}
    assert derived - marks == {"\u0f73", "\u0f75", "\u0f81"}
    assert set(re.findall(cleaning._NON_STARTER, ALL_TEXT)) == derived
    # The quick pre-scan's class: exact up to U+FFFF, every character above.
    possible = cleaning._POSSIBLE_NON_STARTER_CHAR
    assert set(possible.findall(ALL_TEXT[:0x10000])) == {c for c in derived if c <= "\uffff"}
    assert re.fullmatch(cleaning._POSSIBLE_NON_STARTER + "*", ALL_TEXT[0x10000:]) is not None


def test_every_non_starter_counts_towards_a_run() -> None:
    for mark in cleaning._NON_STARTERS:
        check_combining_marks("a" + mark * 30)
        with pytest.raises(ExcessiveCombiningMarks):
            check_combining_marks("a" + mark * 31)


@pytest.mark.parametrize(
    "text",
    [
        "a" + "\u0301" * 31,
        "\u0301" * 31,  # no base character at all
        "a" + "\u0301\u0323" * 16,  # mixed marks of different classes
        "a" + "\U0001d167" * 31,  # a musical combining mark above U+FFFF
        "a" + "\u0301" * 20 + "\x00" + "\u0301" * 20,  # removing the control joins the runs
        "a" + "\u0301" * 20 + "\x9f" + "\u0301" * 20,
        "a" + "\u0301" * 160_000,  # NFC takes about 28 s over this
        "\U0001f600" * 40 + "a" + "\U0001d167" * 31,  # astral characters that are not marks, then marks
        "\u0f73" * 31,  # class 0, but each decomposes into two marks
        "a" + "\u0344" * 16,  # 16 marks that NFC splits into 32
        "\u0958" + "\u093c" * 30,  # NFC splits the letter into a letter and a 31st mark
    ],
)
def test_a_run_of_more_than_30_combining_marks_raises(text: str) -> None:
    with pytest.raises(ExcessiveCombiningMarks):
        clean_text(text)


@pytest.mark.parametrize(
    "text",
    [
        "a" + "\u0301" * 30,
        "a" + "\u0301" * 20 + " " + "\u0301" * 20,  # a space is a starter: two runs of 20
        "a" + "\u0301" * 20 + "\n" + "\u0301" * 20,
        "\U0001f600" * 100,  # astral, but not combining marks
        "e\u0301" * 10_000,  # many short runs
    ],
)
def test_runs_of_at_most_30_combining_marks_pass(text: str) -> None:
    assert clean_text(text) == unicodedata.normalize("NFC", text)


def test_excessive_combining_marks_names_the_run() -> None:
    with pytest.raises(ExcessiveCombiningMarks) as info:
        clean_text("ab" + "\u0301" * 160_000 + "c")
    assert isinstance(info.value, ValueError)
    assert (info.value.run_length, info.value.offset) == (160_000, 2)
    assert "160000" in str(info.value) and "character 2" in str(info.value)
    assert str(pickle.loads(pickle.dumps(info.value))) == str(info.value)


# ---- is_blank ---------------------------------------------------------------------------
def test_invisible_class_is_whitespace_cc_cf_and_default_ignorables() -> None:
    derived = {c for c in ALL_CHARS if c.isspace() or unicodedata.category(c) in ("Cc", "Cf")}
    derived |= {chr(cp) for lo, hi in DEFAULT_IGNORABLE for cp in range(lo, hi + 1)}
    assert set(re.findall(f"[{cleaning._INVISIBLE_RANGES}]", ALL_TEXT)) == derived
    assert cleaning._VISIBLE.pattern == f"[^{cleaning._INVISIBLE_RANGES}]"
    assert {chr(cp) for cp in range(128) if is_blank(chr(cp))} == {c for c in derived if c.isascii()}


@pytest.mark.parametrize(
    "text",
    ["", " ", "\n\t \r", "\x00\x1c\x7f", "\u200b", "\ufeff", "\u2060", "\u00ad", "\u200d", "\u034f", "\u115f\u1160",
     "\u17b4\u17b5", "\u180b\u180e\u180f", "\u3164", "\ufe0f", "\uffa0", "\U000e0001\U000e0041", "\U000e0100", "\U0001bca0",
     "\U0001d173", " \u200b\u3000\ufeff\u2028 "],
)  # fmt: skip
def test_is_blank(text: str) -> None:
    assert is_blank(text)


@pytest.mark.parametrize(
    "text", ["a", " . ", "\u200b中", "\u0301", "\U0001f600", "\ufeffx\ufeff", "\ud800", "\ue000", "\u2066a"]
)
def test_is_not_blank(text: str) -> None:
    assert not is_blank(text)
