"""clean_text and is_blank: properties over generated text, biased towards nasty characters."""

from __future__ import annotations

import functools
import re
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from aieng_core.data import cleaning
from aieng_core.data.cleaning import ExcessiveCombiningMarks, clean_text, collapse_whitespace, is_blank

LINE_BREAKS = "\n\r\x0b\x0c\x85\u2028\u2029"
MARKS = [
    "\u0301",
    "\u0302",
    "\u0323",
    "\u0308",
    "\u0344",
    "\u093c",
    "\u094d",
    "\u05b0",
    "\u064e",
    "\u0e38",
    "\U0001d167",
    "\u0f73",
]
NASTY = [
    *"\n\n\n  \t\r\r\n", "\r\n", "\x00", "\x07", "\x0b", "\x0c", "\x1b", "\x1c", "\x1d", "\x1e", "\x1f", "\x7f", "\x85", "\x9f",
    "\u00a0", "\u1680", "\u2000", "\u2001", "\u2007", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000",
    "\u200b", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u034f", "\u115f", "\u1160", "\u3164", "\ufe0f", "\U000e0001", "\U000e0100",
    *MARKS, "\u0958", "\ufb1d", "\u1f82", "\u01d8", "\u1100", "\u1161", "\u11a8", "\u212b", "\u2126", "\ufffd",
    "a", "e", "o", "A", "\u00e9", "\u0915", "\uac00", "中", "文", "。", ".", "\U0001f600", "\U00020000",
]  # fmt: skip
chunk = st.one_of(
    st.lists(st.sampled_from(NASTY), max_size=12).map("".join),
    st.text(st.characters(exclude_categories=["Cs"]), max_size=8),  # anything but lone surrogates
    st.text(st.sampled_from(MARKS), min_size=25, max_size=40),  # runs near the limit of 30
)
nasty_text = st.lists(chunk, max_size=6).map("".join)

# The Default_Ignorable_Code_Points that are neither Cf nor whitespace (DerivedCoreProperties.txt).
DEFAULT_IGNORABLE = {
    chr(cp)
    for lo, hi in [(0x034F, 0x034F), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F), (0x2065, 0x2065), (0x3164, 0x3164),
                   (0xFE00, 0xFE0F), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0xE0000, 0xE0FFF)]
    for cp in range(lo, hi + 1)
}  # fmt: skip


def without_controls(text: str) -> str:
    """Rules 1-3, spelled out with the standard library."""
    text = text.replace("\r\n", "\n")
    text = re.sub("[\r\x0b\x0c\x85\u2028\u2029]", "\n", text)
    text = re.sub("[\x1c-\x1f]", " ", text)
    return "".join(c for c in text if unicodedata.category(c) != "Cc" or c in "\n\t")


@functools.cache
def is_non_starter(c: str) -> bool:
    return unicodedata.combining(unicodedata.normalize("NFD", c)[0]) != 0


def longest_combining_run(text: str) -> int:
    longest = run = 0
    for c in text:
        run = run + 1 if is_non_starter(c) else 0
        longest = max(longest, run)
    return longest


def reference_clean(text: str) -> str:
    """All the rules, spelled out with the standard library."""
    text = without_controls(text)
    if longest_combining_run(text) > 30:
        raise ExcessiveCombiningMarks(longest_combining_run(text), -1)
    text = unicodedata.normalize("NFC", text)
    if longest_combining_run(text) > 30:  # NFC split a character into marks
        raise ExcessiveCombiningMarks(longest_combining_run(text), -1)
    text = re.sub(r"[^\S\n]+", " ", text)
    text = re.sub(r"(?m)^ $", "", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def visible(c: str) -> bool:
    return not (c.isspace() or unicodedata.category(c) in ("Cc", "Cf") or c in DEFAULT_IGNORABLE)


def cleaned_or_none(text: str) -> str | None:
    try:
        return clean_text(text)
    except ExcessiveCombiningMarks:
        return None


@settings(max_examples=500, deadline=None)
@given(nasty_text)
def test_clean_text_matches_the_reference_rules(text: str) -> None:
    try:
        expected = reference_clean(text)
    except ExcessiveCombiningMarks:
        expected = None
    assert cleaned_or_none(text) == expected  # raises only ExcessiveCombiningMarks, and exactly when the rules say


@settings(max_examples=200, deadline=None)
@given(nasty_text)
def test_clean_text_raises_only_for_a_run_of_more_than_30_marks(text: str) -> None:
    try:
        clean_text(text)
    except ExcessiveCombiningMarks as exc:
        before = without_controls(text)
        after = unicodedata.normalize("NFC", before)
        assert exc.run_length > 30
        # The offset points into the text before NFC or, for a run that NFC made, after it.
        marks = before[exc.offset : exc.offset + exc.run_length]
        if longest_combining_run(before) <= 30:
            marks = after[exc.offset : exc.offset + exc.run_length]
        assert len(marks) == exc.run_length and all(is_non_starter(c) for c in marks)
    else:
        assert longest_combining_run(without_controls(text)) <= 30


@settings(max_examples=200, deadline=None)
@given(nasty_text)
def test_clean_text_is_idempotent(text: str) -> None:
    once = cleaned_or_none(text)
    if once is not None:
        assert clean_text(once) == once


@settings(max_examples=200, deadline=None)
@given(nasty_text)
def test_clean_text_never_produces_a_replacement_character(text: str) -> None:
    cleaned = cleaned_or_none(text)
    if cleaned is not None and "\ufffd" not in text:
        assert "\ufffd" not in cleaned


@settings(max_examples=200, deadline=None)
@given(nasty_text)
def test_clean_text_output_shape(text: str) -> None:
    cleaned = cleaned_or_none(text)
    if cleaned is None:
        return
    assert [c for c in cleaned if unicodedata.category(c) == "Cc" and c != "\n"] == []
    assert "\r" not in cleaned
    assert not any(c.isspace() and c not in " \n" for c in cleaned)
    assert "\n\n\n" not in cleaned
    assert "\n \n" not in cleaned  # whitespace-only lines are blank
    assert "  " not in cleaned
    assert cleaned == cleaned.strip()
    assert unicodedata.is_normalized("NFC", cleaned)


@settings(max_examples=200, deadline=None)
@given(nasty_text)
def test_clean_text_adds_no_line_breaks(text: str) -> None:
    cleaned = cleaned_or_none(text)
    if cleaned is not None:
        assert cleaned.count("\n") <= sum(text.count(c) for c in LINE_BREAKS)


@settings(max_examples=200, deadline=None)
@given(nasty_text)
def test_is_blank_after_cleaning_means_nothing_visible_before(text: str) -> None:
    cleaned = cleaned_or_none(text)
    if cleaned is not None:
        assert is_blank(cleaned) == (not any(visible(c) for c in text))


@settings(max_examples=200, deadline=None)
@given(nasty_text)
def test_is_blank_agrees_with_a_character_by_character_check(text: str) -> None:
    assert is_blank(text) == (not any(visible(c) for c in text))


@settings(max_examples=200, deadline=None)
@given(nasty_text)
def test_collapse_whitespace_fast_path_agrees_with_the_full_rewrite(text: str) -> None:
    text = without_controls(text)  # clean_text handles control characters first
    full = "\n".join(cleaning._collapse_line(line) for line in text.split("\n"))
    assert collapse_whitespace(text) == full


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=["Cc", "Zs", "Zl", "Zp", "Cs"]), max_size=30))
def test_text_without_whitespace_or_controls_only_gets_nfc(text: str) -> None:
    text = "".join(c for c in text if not c.isspace())  # at most 30 characters: no run of 31 marks
    assert clean_text(text) == unicodedata.normalize("NFC", text)
