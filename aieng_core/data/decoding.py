"""Turning landed bytes into text without ever guessing silently.

A unit (a JSONL line, a CSV line, a Parquet cell) is decoded on its own: strict UTF-8 first,
then each of `data.fallback_encodings` in order (default: GB18030, a superset of GBK and
GB2312). Never errors="replace": a replacement character in training data is data loss
nobody sees. Statistical detectors misread short GBK text as Thai or Cyrillic, so none is
used.

A decode that succeeds is not evidence of the right encoding: strict GB18030 accepts most
Latin-1 text ("Zürich" -> "Z黵ich") and CESU-8 or overlong UTF-8 (MySQL `utf8` exports,
Java) as rare ideographs. So the GB fallback is taken only when the bytes look like Chinese
text: its double-byte codes lie in the GB2312 layout (lead and trail bytes 0xA1-0xFE), where
ordinary Chinese text lives, while Latin-1 letters are followed by ASCII bytes, which GB2312
never uses as a trail byte. A unit that decodes only as implausible GB18030 is
`ambiguous_encoding`; one that decodes as nothing is `undecodable`. Other configured
encodings (e.g. cp1252) are the user's word and are taken as they decode.
"""

from __future__ import annotations

import codecs
import re
from typing import NamedTuple

from aieng_core.data import reasons

# Longest marks first: the UTF-32-LE mark begins with the UTF-16-LE one.
BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
DEFAULT_FALLBACK_ENCODINGS = ("gb18030",)
GB_FAMILY = frozenset({"gb18030", "gbk", "gb2312"})

# GB18030 multi-byte sequences: four bytes (lead, digit, lead, digit) or two (lead, trail).
# Scanning left to right keeps the alignment, because ASCII bytes never start a sequence.
_GB_SEQUENCE = re.compile(rb"[\x81-\xfe](?:[\x30-\x39][\x81-\xfe][\x30-\x39]|[\x40-\x7e\x80-\xfe])")
# Where GB2312 puts characters: rows 0xA1-0xA9 (punctuation, full-width forms, kana, ...)
# and 0xB0-0xF7 (hanzi); 0xAA-0xAF and 0xF8-0xFE are user-defined areas.
_GB2312_LEADS = frozenset([*range(0xA1, 0xAA), *range(0xB0, 0xF8)])
# At most one double-byte code in this many may fall outside GB2312 (GBK-only characters).
_RARE_SHARE = 5
# Well-formed-looking UTF-8 multi-byte sequences, to tell damaged UTF-8 from legacy text.
# (Exactly the well-formed ones of RFC 3629: no surrogates, as CESU-8 writes, and no overlongs.)
_UTF8_SEQUENCE = re.compile(
    rb"[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]|[\xe1-\xec\xee\xef][\x80-\xbf]{2}|\xed[\x80-\x9f][\x80-\xbf]"
    rb"|\xf0[\x90-\xbf][\x80-\xbf]{2}|[\xf1-\xf3][\x80-\xbf]{3}|\xf4[\x80-\x8f][\x80-\xbf]{2}"
)


class Decoded(NamedTuple):
    text: str | None  # None when the unit could not be decoded
    encoding: str | None = None
    reason: str | None = None  # undecodable or ambiguous_encoding when text is None
    detail: str | None = None


def bom_encoding(head: bytes) -> tuple[str, int] | None:
    """The codec a byte-order mark at the start of `head` selects, and the mark's length."""
    for mark, encoding in BOMS:
        if head.startswith(mark):
            return encoding, len(mark)
    return None


def plausibly_chinese(data: bytes) -> bool:
    """True when GB18030-decodable bytes look like Chinese text rather than another
    single-byte or UTF-8-variant encoding read as GB18030."""
    core = rare = 0
    for match in _GB_SEQUENCE.finditer(data):
        sequence = match.group()
        if len(sequence) == 4:
            return False  # 4-byte codes hold rare and non-Chinese characters; too easy to hit by chance
        # Two accented Latin-1 letters inside a word ("ção" in Configuração) can pair up as a
        # GB2312 code; a hanzi between two ASCII letters almost never occurs in real text.
        in_word = _is_ascii_letter(data, match.start() - 1) and _is_ascii_letter(data, match.end())
        if sequence[0] in _GB2312_LEADS and sequence[1] >= 0xA1 and not in_word:
            core += 1
        else:
            rare += 1
    return core > 0 and rare * _RARE_SHARE <= core + rare


def _is_ascii_letter(data: bytes, index: int) -> bool:
    return 0 <= index < len(data) and (0x41 <= data[index] <= 0x5A or 0x61 <= data[index] <= 0x7A)


def _hint(data: bytes, latin: bool = True) -> str:
    if re.search(rb"\xed[\xa0-\xbf][\x80-\xbf]", data):
        return " (it looks like CESU-8 or Java's modified UTF-8: UTF-16 surrogates encoded as UTF-8)"
    if re.search(rb"[\xc0\xc1][\x80-\xbf]|\xe0[\x80-\x9f][\x80-\xbf]|\xf0[\x80-\x8f]", data):
        return " (it holds overlong UTF-8 sequences)"
    return " (it may be Latin-1 or cp1252: add that to data.fallback_encodings if so)" if latin else ""


def _damaged_utf8(data: bytes, error: UnicodeDecodeError) -> str | None:
    """Why `data` is UTF-8 with damage rather than text in another encoding, if it is.

    UTF-8 Chinese is also valid GB18030 most of the time, so a UTF-8 line cut off inside a
    character, or with one bad byte among many UTF-8 characters, must not fall through to
    GB18030 and come out as plausible-looking mojibake."""
    if error.reason == "unexpected end of data":
        return f"UTF-8 cut off inside a character at byte {error.start}"
    sequences = _UTF8_SEQUENCE.findall(data)
    stray = sum(1 for byte in data if byte >= 0x80) - sum(len(s) for s in sequences)
    if sequences and stray * 2 <= len(sequences):
        return (
            f"invalid UTF-8 ({stray} stray bytes among {len(sequences)} UTF-8 characters; first at byte {error.start})"
        )
    return None


def decode_unit(data: bytes, fallbacks: tuple[str, ...] = DEFAULT_FALLBACK_ENCODINGS) -> Decoded:
    """Decode one unit: strict UTF-8, else the first fallback that decodes it plausibly."""
    try:
        return Decoded(data.decode("utf-8"), "utf-8")
    except UnicodeDecodeError as error:
        if (damage := _damaged_utf8(data, error)) is not None:
            return Decoded(None, reason=reasons.UNDECODABLE, detail=damage + _hint(data, latin=False))
    implausible = None
    for encoding in fallbacks:
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError:
            continue
        if codecs.lookup(encoding).name in GB_FAMILY and not plausibly_chinese(data):
            implausible = implausible or encoding
            continue
        return Decoded(text, encoding)
    if implausible:
        return Decoded(
            None,
            reason=reasons.AMBIGUOUS_ENCODING,
            detail=f"not UTF-8; decodes as {implausible} but does not look like Chinese text{_hint(data)}",
        )
    tried = ", ".join(("utf-8", *fallbacks))
    return Decoded(None, reason=reasons.UNDECODABLE, detail=f"bytes are not valid in any accepted encoding ({tried})")
