"""Text cleaning: pure functions, applied by clean_text in this order.

1. Line breaks become "\\n": "\\r\\n" first, then a lone "\\r", "\\x0b", "\\x0c", NEL "\\x85",
   U+2028 and U+2029 (so lines never glue together).
2. The other separators "\\x1c"-"\\x1f" become a space (so words never glue together).
3. The remaining control characters (Unicode Cc) other than "\\n" and "\\t" are removed.
4. A run of more than 30 combining marks raises ExcessiveCombiningMarks (the limit of the
   Unicode Stream-Safe Text Format, UAX #15): NFC is quadratic in the length of such a run,
   so hostile text could hang the pipeline. A combining mark here is a non-starter: a
   character of canonical combining class != 0, or one of the three Tibetan vowel signs
   U+0F73, U+0F75, U+0F81 that decompose into two of them.
5. NFC, only where unicodedata.is_normalized says it is needed. NFC can lengthen a run (it
   splits U+0344 into two marks, U+0958 into a letter and a mark), so the check of rule 4
   runs again on its output: what clean_text returns never fails it.
6. Each run of whitespace other than "\\n" becomes one space; a line of only whitespace
   becomes blank.
7. Three or more newlines become two; leading and trailing whitespace goes.

The order makes clean_text idempotent: control characters go before the combining-mark
check (removing one can join two runs) and before NFC (where they would block
composition); whitespace is collapsed after NFC, which can turn one space into another.

is_blank says whether a text holds nothing visible (clean_text keeps invisible format
characters such as U+200B, which are part of some scripts' spelling).
"""

from __future__ import annotations

import re
import unicodedata

# Unicode category Cc (C0, DEL, C1) except \t and \n. \t is whitespace and becomes a space below.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_LINE_BREAK = re.compile("[\r\x0b\x0c\x85\u2028\u2029]")  # after "\r\n" has become "\n"
_SEPARATOR = re.compile("[\x1c-\x1f]")  # file, group, record and unit separators
# Anything the three rules above change: one scan tells whether a non-ASCII text needs them.
_CONTROL_OR_LINE_BREAK = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")

# The same rules as bytes, for ASCII text: bytes.translate maps and deletes at C speed,
# many times faster than a regex scan.
_ASCII_BREAKS_AND_SEPARATORS = bytes.maketrans(b"\r\x0b\x0c\x1c\x1d\x1e\x1f", b"\n\n\n    ")
_ASCII_DELETED = bytes([*range(0x00, 0x09), *range(0x0E, 0x1C), 0x7F])  # Cc but \t \n and the above

# Whitespace other than "\n" and " " (str.isspace() is the definition regex \s uses too).
# For ASCII text the checks below use plain substring tests, faster than a regex scan; for
# other text one scan for this class beats iterating over the characters ten times over.
# Only the texts that need it are rewritten.
# tests/core/test_cleaning.py re-derives this set from str.isspace() over all code points.
_OTHER_WHITESPACE = frozenset(
    "\x09\x0b\x0c\x0d\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_OTHER_WHITESPACE_CHAR = re.compile("[" + re.escape("".join(sorted(_OTHER_WHITESPACE))) + "]")
_SPACE_RUN = re.compile(r"  +")
# Two or more newlines with nothing but (collapsed) whitespace between them: a paragraph break.
_BLANK_LINES = re.compile(r"\n(?: ?\n)+")

MAX_COMBINING_RUN = 30  # the Stream-Safe Text Format's limit on consecutive non-starters (UAX #15)


def _ranges(chars: str) -> str:
    """The inside of a regex character class matching exactly `chars`, as ranges to compile small."""
    ranges: list[list[int]] = []
    for code in sorted(map(ord, chars)):
        if ranges and ranges[-1][1] == code - 1:
            ranges[-1][1] = code
        else:
            ranges.append([code, code])
    return "".join(re.escape(chr(lo)) + ("" if lo == hi else "-" + re.escape(chr(hi))) for lo, hi in ranges)


# Non-starters: the characters whose canonical decomposition begins with a combining mark.
# Derived from the running Python's Unicode database, the one NFC itself uses, so the guard
# matches NFC exactly. Every combining mark lies in U+0300..U+1FFFF (the test checks all code
# points); scanning only that range keeps the import cost near 20 ms instead of 150 ms.
# Three Tibetan vowel signs have combining class 0 but decompose into two marks each (UAX #15
# names them; the test checks there are no others): NFC is as slow on a run of them.
_NON_STARTERS = "".join(filter(unicodedata.combining, map(chr, range(0x300, 0x20000)))) + "\u0f73\u0f75\u0f81"
_NON_STARTER = f"[{_ranges(_NON_STARTERS)}]"
_NON_STARTER_RUN = re.compile(f"{_NON_STARTER}{{{MAX_COMBINING_RUN + 1},}}")
# The exact class is slow to scan: the regex engine tests its ~70 ranges above U+FFFF one by
# one, about 10 MB/s. Counting every character above U+FFFF as a possible non-starter gives a
# superset that scans 10-20 times faster; only a text with a run of those needs the exact scan.
_BMP_NON_STARTERS = "".join(c for c in _NON_STARTERS if c <= "\uffff")
_POSSIBLE_NON_STARTER = f"[{_ranges(_BMP_NON_STARTERS)}\U00010000-\U0010ffff]"
_POSSIBLE_NON_STARTER_CHAR = re.compile(_POSSIBLE_NON_STARTER)
# "[x][x]{30,}" rather than "[x]{31,}": a pattern that starts with a plain class lets the regex
# engine skip ahead to candidate characters in a tight loop, about twice as fast.
_POSSIBLE_NON_STARTER_RUN = re.compile(f"{_POSSIBLE_NON_STARTER}{_POSSIBLE_NON_STARTER}{{{MAX_COMBINING_RUN},}}")

# Characters that show nothing: whitespace, Cc, Cf and the other Default_Ignorable_Code_Points
# (Unicode's DerivedCoreProperties.txt; unicodedata does not expose that property).
# tests/core/test_cleaning.py re-derives the whitespace, Cc and Cf part over all code points.
_INVISIBLE_RANGES = (
    "\x00-\x20\x7f-\xa0\xad"  # Cc, ASCII and Latin-1 whitespace, soft hyphen
    "\u034f"  # combining grapheme joiner
    "\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2"  # Arabic and Syriac format characters
    "\u115f-\u1160\u1680\u17b4-\u17b5\u180b-\u180f"  # Hangul fillers, ogham space, Khmer, Mongolian
    "\u2000-\u200f\u2028-\u202f\u205f-\u206f"  # spaces, zero-width, bidi controls, word joiner
    "\u3000\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb"  # ideographic space, fillers, variation selectors, BOM
    # Kaithi, Egyptian hieroglyph, shorthand and musical format controls
    "\U000110bd\U000110cd\U00013430-\U00013438\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e0fff"  # tags, variation selectors supplement
)
_VISIBLE = re.compile(f"[^{_INVISIBLE_RANGES}]")
_ASCII_INVISIBLE = "".join(map(chr, [*range(0x00, 0x21), 0x7F]))


class ExcessiveCombiningMarks(ValueError):
    """A text holds a run of more than MAX_COMBINING_RUN combining marks (non-starters)."""

    def __init__(self, run_length: int, offset: int) -> None:
        super().__init__(run_length, offset)  # keeps the exception picklable
        self.run_length = run_length
        self.offset = offset

    def __str__(self) -> str:
        return (
            f"a run of {self.run_length} combining marks at character {self.offset}; "
            f"the limit is {MAX_COMBINING_RUN} (Unicode stream-safe text, UAX #15)"
        )


def clean_control_characters(text: str) -> str:
    """Rules 1-3: line breaks -> "\\n", separators \\x1c-\\x1f -> " ", other Cc but \\n and \\t removed."""
    if text.isascii():  # O(1) in CPython: the string knows it is ASCII
        data = text.encode("ascii")
        if data.translate(_ASCII_BREAKS_AND_SEPARATORS, _ASCII_DELETED) == data:
            return text  # the common case: nothing to change
        # "\r\n" first, or the table would turn it into two newlines.
        return data.replace(b"\r\n", b"\n").translate(_ASCII_BREAKS_AND_SEPARATORS, _ASCII_DELETED).decode("ascii")
    if _CONTROL_OR_LINE_BREAK.search(text) is None:
        return text
    text = text.replace("\r\n", "\n")
    text = _LINE_BREAK.sub("\n", text)
    text = _SEPARATOR.sub(" ", text)
    return _CONTROL.sub("", text)


def check_combining_marks(text: str) -> None:
    """Rule 4: raise ExcessiveCombiningMarks if `text` holds a run of more than
    MAX_COMBINING_RUN non-starters. Linear time; the offset is a character index into `text`."""
    if text.isascii():  # ASCII has no combining marks
        return
    # Any run of 31 consecutive characters covers an index divisible by 31, so a text whose
    # every 31st character is a starter has no such run. The slice is made at C speed and most
    # text (Latin, CJK) passes here; scripts rich in marks go on to the two scans below.
    if _POSSIBLE_NON_STARTER_CHAR.search(text[:: MAX_COMBINING_RUN + 1]) is None:
        return
    if _POSSIBLE_NON_STARTER_RUN.search(text) is None:
        return
    if (run := _NON_STARTER_RUN.search(text)) is not None:
        raise ExcessiveCombiningMarks(run.end() - run.start(), run.start())


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
    if "\t" in text or (not text.isascii() and _OTHER_WHITESPACE_CHAR.search(text) is not None):
        return "\n".join([_collapse_line(line) for line in text.split("\n")])
    if "  " in text:
        return _SPACE_RUN.sub(" ", text)  # only spaces to squeeze: a literal-prefix regex is fast
    return text


def clean_text(text: str) -> str:
    """Clean `text` by rules 1-7 of the module docstring.

    Raises ExcessiveCombiningMarks for a run of more than 30 combining marks.
    """
    text = clean_control_characters(text)
    check_combining_marks(text)  # before NFC, which would take quadratic time over a long run
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
        check_combining_marks(text)  # NFC can lengthen a run; this keeps clean_text idempotent
    text = collapse_whitespace(text)
    # Substring tests first: most texts have paragraph breaks the regex would only rewrite as-is.
    if "\n\n\n" in text or "\n \n" in text:
        text = _BLANK_LINES.sub("\n\n", text)
    return text.strip()


def is_blank(text: str) -> bool:
    """True when `text` holds nothing visible: only whitespace, control characters (Cc),
    format characters (Cf) and other default-ignorable code points such as U+034F."""
    if text.isascii():
        return not text.strip(_ASCII_INVISIBLE)
    return _VISIBLE.search(text) is None  # stops at the first visible character
