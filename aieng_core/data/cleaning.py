"""Text cleaning, one pure function.

Order matters and makes the function idempotent: control characters go first (so they can
neither hide inside whitespace runs nor block NFC composition), then NFC, then whitespace.
"""

from __future__ import annotations

import re
import unicodedata

# Unicode category Cc (C0, DEL, C1) except \t and \n. \t is whitespace and becomes a space below.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Whitespace other than "\n" and " " (str.isspace() is the definition regex \s uses too).
# Python's regex engine scans character classes slowly, so the checks below use plain
# substring and set tests and only rewrite the texts that need it.
# tests/core/test_cleaning.py re-derives this set from str.isspace() over all code points.
_OTHER_WHITESPACE = frozenset(
    "\x09\x0b\x0c\x0d\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
# The same control characters as bytes, for ASCII text: bytes.translate deletes them at C
# speed, many times faster than a regex scan.
_ASCII_CONTROL_BYTES = bytes([*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F])
_NEWLINE_RUN = re.compile(r"\n{3,}")
_SPACE_RUN = re.compile(r"  +")


def _collapse_line(line: str) -> str:
    # str.split() splits on exactly the characters str.isspace() accepts, like regex \s.
    words = line.split()
    if not words:
        return " " if line else ""
    collapsed = " ".join(words)
    if line[0].isspace():
        collapsed = " " + collapsed
    if line[-1].isspace():
        collapsed += " "
    return collapsed


def collapse_whitespace(text: str) -> str:
    """Collapse each run of whitespace other than newlines to a single space.

    Expects control characters already removed (clean_text does that first): then, in
    ASCII text, spaces and tabs are the only whitespace besides newlines.
    """
    if "\t" in text or (not text.isascii() and not _OTHER_WHITESPACE.isdisjoint(text)):
        return "\n".join([_collapse_line(line) for line in text.split("\n")])
    if "  " in text:
        return _SPACE_RUN.sub(" ", text)  # only spaces to squeeze: a literal-prefix regex is fast
    return text


def remove_control_characters(text: str) -> str:
    """Drop Unicode Cc characters except \\t and \\n."""
    if text.isascii():  # O(1) in CPython: the string knows it is ASCII
        data = text.encode("ascii")
        kept = data.translate(None, _ASCII_CONTROL_BYTES)
        return text if len(kept) == len(data) else kept.decode("ascii")
    return _CONTROL.sub("", text)


def clean_text(text: str) -> str:
    """Remove control characters except \\n and \\t, normalize to NFC, collapse runs of
    other whitespace to one space (newlines untouched), collapse 3+ newlines to 2, strip."""
    text = remove_control_characters(text)
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    text = collapse_whitespace(text)
    if "\n\n\n" in text:
        text = _NEWLINE_RUN.sub("\n\n", text)
    return text.strip()
