"""clean_text: examples of every rule, and properties over messy generated text."""

from __future__ import annotations

import re
import sys
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aieng_core.data import cleaning
from aieng_core.data.cleaning import clean_text, collapse_whitespace


@pytest.mark.parametrize(
    "raw, expected",
    [
        # control characters go, except \n and \t (which becomes a space)
        ("a\x00b", "ab"),
        ("a\x07b\x1bc", "abc"),
        ("del\x7fete", "delete"),
        ("c1\x85\x9fchars", "c1chars"),
        ("a\x0bb\x0cc", "abc"),  # vertical tab and form feed are control characters
        ("line\r\nbreak", "line\nbreak"),  # CR is a control character
        ("a\tb", "a b"),
        ("a\t\t b", "a b"),
        # NFC
        ("e\u0301t\u00e9", "\u00e9t\u00e9"),
        ("\u212b", "\u00c5"),  # ANGSTROM SIGN -> A WITH RING
        ("\u1100\u1161", "\uac00"),  # Hangul jamo compose
        ("e\x00\u0301", "\u00e9"),  # a control character does not block composition
        ("o\u0323\u0302", "\u1ed9"),  # canonical reordering then composition
        # whitespace runs -> one space, newlines untouched
        ("a  b", "a b"),
        ("a\u00a0b", "a b"),  # NBSP
        ("a\u3000\u3000b", "a b"),  # ideographic space
        ("a\u2028b", "a b"),  # line separator is not a newline here
        ("a \u2029\u202f\u205f\u1680 b", "a b"),
        ("a\u2000b\u200ac", "a b c"),
        ("中文\u3000文本", "中文 文本"),
        ("a\u200bb", "a\u200bb"),  # ZERO WIDTH SPACE is not whitespace (category Cf)
        ("a\nb", "a\nb"),
        ("a  \n \t b", "a \n b"),
        ("a\n\nb", "a\n\nb"),
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
        # already clean text is unchanged
        ("Hello, world.\n\nSecond paragraph.", "Hello, world.\n\nSecond paragraph."),
    ],
)
def test_clean_text_examples(raw: str, expected: str) -> None:
    assert clean_text(raw) == expected


def test_other_whitespace_is_exactly_isspace_minus_newline_and_space() -> None:
    derived = {chr(cp) for cp in range(sys.maxunicode + 1) if chr(cp).isspace()} - {"\n", " "}
    assert cleaning._OTHER_WHITESPACE == frozenset(derived)


def test_control_pattern_is_exactly_category_cc_minus_newline_and_tab() -> None:
    derived = {chr(cp) for cp in range(0x10000) if unicodedata.category(chr(cp)) == "Cc"} - {"\n", "\t"}
    matched = {chr(cp) for cp in range(0x10000) if cleaning._CONTROL.match(chr(cp))}
    assert matched == derived


# ---- properties -------------------------------------------------------------------------
MESSY = [
    "\n", "\n", "\n", " ", " ", "\t", "\r", "\x00", "\x07", "\x0b", "\x0c", "\x1b", "\x1c", "\x1f", "\x7f", "\x85", "\x9f",
    "\u00a0", "\u1680", "\u2000", "\u2001", "\u2007", "\u200a", "\u200b", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\ufeff",
    "\u0301", "\u0302", "\u0323", "\u0308", "\u0344", "\u0958", "\u093c", "\u1100", "\u1161", "\u11a8", "\u212b", "\u2126",
    "a", "e", "o", "A", "\u00e9", "\u0915", "\uac00", "中", "文", ".", "\U0001f600",
]
messy_text = st.text(alphabet=st.sampled_from(MESSY) | st.characters(), max_size=60)


def reference_clean(text: str) -> str:
    """The rules, spelled out with the standard library."""
    text = "".join(c for c in text if unicodedata.category(c) != "Cc" or c in "\n\t")
    text = unicodedata.normalize("NFC", text)
    text = re.sub(r"[^\S\n]+", " ", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


@settings(max_examples=300, deadline=None)
@given(messy_text)
def test_clean_text_is_idempotent(text: str) -> None:
    once = clean_text(text)
    assert clean_text(once) == once


@settings(max_examples=300, deadline=None)
@given(messy_text)
def test_clean_text_leaves_no_control_characters_but_newline(text: str) -> None:
    assert [c for c in clean_text(text) if unicodedata.category(c) == "Cc" and c != "\n"] == []


@settings(max_examples=300, deadline=None)
@given(messy_text)
def test_clean_text_never_adds_newlines(text: str) -> None:
    assert clean_text(text).count("\n") <= text.count("\n")


@settings(max_examples=300, deadline=None)
@given(messy_text)
def test_clean_text_output_is_nfc(text: str) -> None:
    assert unicodedata.is_normalized("NFC", clean_text(text))


@settings(max_examples=300, deadline=None)
@given(messy_text)
def test_clean_text_whitespace_shape(text: str) -> None:
    cleaned = clean_text(text)
    assert cleaned == cleaned.strip()
    assert "\n\n\n" not in cleaned
    assert "  " not in cleaned
    assert not any(c.isspace() and c not in " \n" for c in cleaned)


@settings(max_examples=300, deadline=None)
@given(messy_text)
def test_clean_text_matches_the_reference_rules(text: str) -> None:
    assert clean_text(text) == reference_clean(text)


@settings(max_examples=300, deadline=None)
@given(messy_text)
def test_collapse_whitespace_fast_path_agrees_with_the_full_rewrite(text: str) -> None:
    text = cleaning._CONTROL.sub("", text)  # clean_text removes control characters first
    full = "\n".join(cleaning._collapse_line(line) for line in text.split("\n"))
    assert collapse_whitespace(text) == full


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Zs", "Zl", "Zp", "Cs")), max_size=40))
def test_text_without_whitespace_or_controls_only_gets_nfc(text: str) -> None:
    text = "".join(c for c in text if not c.isspace())
    assert clean_text(text) == unicodedata.normalize("NFC", text)
