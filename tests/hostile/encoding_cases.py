"""Encoding cases: legacy single-byte and broken UTF-8 lines that must be ambiguous or
undecodable, GBK Chinese that must stay clean, 10,000-line files in the wide encodings
(UTF-16, UTF-32), and byte-order marks where they belong and where they do not.
"""

from __future__ import annotations

from tests.hostile.builders import Case, Lines, case_of, dumps, text_of
from tests.hostile.spec import AMBIGUOUS_ENCODING, AS_GB18030, AS_UTF8, MALFORMED_JSON, UNDECODABLE


def encoding_cases() -> list[Case]:
    out = []

    def one_bad_line(kind: str, raw: bytes, reason: str, unit: str, note: str = "") -> Case:
        f = Lines(kind)
        f.good()
        if reason in (AS_UTF8, AS_GB18030):
            raise ValueError(reason)
        f.add(raw, reason, unit=unit)
        f.good()
        return case_of(kind, f, note=note)

    def line(kind: str, text: bytes) -> bytes:
        return b'{"id": "' + kind.encode() + b'-x", "text": "' + text + b'"}'

    out.append(
        one_bad_line(
            "latin1_zurich",
            line("latin1_zurich", "Grüezi from Zürich, latin1_zurich".encode("latin-1")),
            AMBIGUOUS_ENCODING,
            AMBIGUOUS_ENCODING,
        )
    )
    out.append(
        one_bad_line(
            "cp1252_mueller",
            line("cp1252_mueller", "Herr Müller signs cp1252_mueller".encode("cp1252")),
            AMBIGUOUS_ENCODING,
            AMBIGUOUS_ENCODING,
        )
    )
    # A cp1252 closing quote (0x94) before a space is not even GB18030: undecodable, not ambiguous.
    out.append(
        one_bad_line(
            "cp1252_smart_quotes",
            line("cp1252_smart_quotes", "He said “hello” in cp1252_smart_quotes".encode("cp1252")),
            UNDECODABLE,
            UNDECODABLE,
        )
    )
    out.append(
        one_bad_line(
            "cp1252_euro", line("cp1252_euro", "It costs 5 € in cp1252_euro".encode("cp1252")), UNDECODABLE, UNDECODABLE
        )
    )
    out.append(
        one_bad_line(
            "cesu8_emoji",
            line("cesu8_emoji", b"an emoji \xed\xa0\xbd\xed\xb8\x80 in CESU-8, cesu8_emoji"),
            AMBIGUOUS_ENCODING,
            AMBIGUOUS_ENCODING,
        )
    )
    out.append(
        one_bad_line(
            "overlong_nul",
            line("overlong_nul", b"an overlong \xc0\x80 NUL, overlong_nul"),
            AMBIGUOUS_ENCODING,
            AMBIGUOUS_ENCODING,
        )
    )
    out.append(
        one_bad_line(
            "overlong_slash",
            line("overlong_slash", b"path \xe0\x80\xafetc/passwd, overlong_slash"),
            AMBIGUOUS_ENCODING,
            AMBIGUOUS_ENCODING,
        )
    )
    out.append(
        one_bad_line(
            "overlong_slash_at_quote",
            line("overlong_slash_at_quote", b"ends in an overlong slash \xe0\x80\xaf"),
            UNDECODABLE,
            UNDECODABLE,
            note="0xAF before the closing '\"' is no GB18030 sequence, so this spec example is undecodable in context",
        )
    )
    out.append(
        one_bad_line(
            "invalid_bytes",
            line("invalid_bytes", b"bytes \xff\xfe\xfd that are nothing, invalid_bytes"),
            UNDECODABLE,
            UNDECODABLE,
        )
    )
    out.append(
        one_bad_line(
            "gb18030_four_byte",
            line("gb18030_four_byte", "数据管道的每一行都要清洗干净 😀 gb18030_four_byte".encode("gb18030")),
            AMBIGUOUS_ENCODING,
            AMBIGUOUS_ENCODING,
            note="real Chinese, but a four-byte GB18030 sequence (the emoji) makes it implausible per the spec",
        )
    )
    out.append(
        one_bad_line(
            "gbk_traditional",
            line("gbk_traditional", "這個資料管道的文字 gbk_traditional".encode("gbk")),
            AMBIGUOUS_ENCODING,
            AMBIGUOUS_ENCODING,
            note="traditional characters sit outside the GB2312 layout: 3 of 9 codes, more than 1 in 5",
        )
    )

    # GBK that is real Chinese stays clean, alone and beside UTF-8 lines.
    kind = "gbk_real_chinese"
    f = Lines(kind)
    for number, text in enumerate(
        ["数据管道的每一行都要清洗干净", "中文文本必须保持原样不变", "朱镕基总理讲话数据管道"], 1
    ):
        doc_id = f"{kind}-{number}"
        text = f"{text} {kind}"
        f.add(dumps({"id": doc_id, "text": text}).decode().encode("gbk"), clean=(doc_id, text), unit=AS_GB18030)
    out.append(case_of(kind, f, note="镕 is GBK but not GB2312: 1 code in 11 outside the layout is still plausible"))

    kind = "utf8_chinese"
    f = Lines(kind)
    for number, text in enumerate(
        ["数据管道的每一行都要清洗干净", "日本語のテキストも大丈夫です", "한국어 텍스트도 괜찮습니다"], 1
    ):
        f.record({"id": f"{kind}-{number}", "text": f"{text} {kind}"})
    out.append(case_of(kind, f))

    kind = "mixed_gbk_utf8_lines"
    f = Lines(kind)
    for number in range(1, 9):
        doc_id, text = f"{kind}-{number}", f"第{number}行的中文数据清洗文本 {kind}"
        encoding = "gbk" if number % 2 else "utf-8"
        f.add(
            dumps({"id": doc_id, "text": text}).decode().encode(encoding),
            clean=(doc_id, text),
            unit=AS_GB18030 if encoding == "gbk" else AS_UTF8,
        )
    out.append(case_of(kind, f))
    return out


# Characters whose raw little- or big-endian code units hold 0x0A off the aligned offsets, so a
# reader that splits wide text on the newline byte pattern without alignment breaks the line.
WIDE_TRAPS = "ਊĀ and Āਊ"


def _wide_case(kind: str, codec: str, bom: bytes, bad_unit: bytes) -> Case:
    """10,000 JSONL lines in a wide encoding, one with an invalid code unit: only it is lost."""
    name = f"{kind}.jsonl"
    newline = "\n".encode(codec)
    lines, clean, clean_at = [], {}, {}
    bad_at, blank_at = 5000, 7000
    physical = 0
    for number in range(1, 10_001):
        physical += 1
        if physical == blank_at:
            lines.append(" \t ".encode(codec))  # a blank line: not a record, but a physical line
            physical += 1
        doc_id = f"{kind}-{number}"
        text = f"{kind} line {number}" + (f", wide traps {WIDE_TRAPS}" if number % 1000 == 1 else ", plain")
        record = dumps({"id": doc_id, "text": text}).decode()
        if physical == bad_at:
            head, tail = record[:20], record[20:]
            lines.append(head.encode(codec) + bad_unit + tail.encode(codec))
            continue
        lines.append(record.encode(codec))
        clean[doc_id] = text
        clean_at[doc_id] = (name, physical)
    data = bom + newline.join(lines) + newline
    return Case(
        kind=kind,
        files={name: data},
        expected_reasons={UNDECODABLE: 1},
        expected_clean=clean,
        expected_records=10_000,
        quarantine_lines=((name, bad_at, UNDECODABLE),),
        clean_lines=clean_at,
    )


def wide_cases() -> list[Case]:
    out = [
        _wide_case("utf16le_10k", "utf-16-le", b"\xff\xfe", b"\x00\xd8"),  # a lone high surrogate
        _wide_case("utf16be_10k", "utf-16-be", b"\xfe\xff", b"\xdc\x00"),  # a lone low surrogate
        _wide_case("utf32le_10k", "utf-32-le", b"\xff\xfe\x00\x00", b"\x00\x00\x11\x00"),  # beyond U+10FFFF
        _wide_case("utf32be_10k", "utf-32-be", b"\x00\x00\xfe\xff", b"\x00\x00\xd8\x00"),  # a surrogate code point
    ]

    kind = "utf16_odd_trailing_byte"
    name = f"{kind}.jsonl"
    records = [{"id": f"{kind}-{n}", "text": text_of(kind, n)} for n in (1, 2, 3, 4)]
    body = b"".join(dumps(r).decode().encode("utf-16-le") + "\n".encode("utf-16-le") for r in records[:3])
    data = b"\xff\xfe" + body + dumps(records[3]).decode().encode("utf-16-le") + b"X"
    out.append(
        Case(
            kind=kind,
            files={name: data},
            expected_reasons={UNDECODABLE: 1},
            expected_clean={r["id"]: r["text"] for r in records[:3]},
            expected_records=4,
            quarantine_lines=((name, 4, UNDECODABLE),),
            clean_lines={r["id"]: (name, n) for n, r in enumerate(records[:3], 1)},
            note="the last line (no newline) has an odd byte count, so it alone is undecodable",
        )
    )

    kind = "utf16le_no_bom"
    f = Lines(kind)
    data = b"".join(
        dumps({"id": f"{kind}-{n}", "text": text_of(kind, n)}).decode().encode("utf-16-le") + "\n".encode("utf-16-le")
        for n in (1, 2, 3)
    )
    # Without a BOM the file is split on b"\n": 3 lines of UTF-8-valid bytes full of NULs
    # (the 2nd and 3rd starting with the NUL half of the previous newline) and a last line
    # b"\x00". None is blank (NUL is not ASCII whitespace) and none is JSON.
    out.append(
        Case(
            kind=kind,
            files={f.name: data},
            expected_reasons={MALFORMED_JSON: 4},
            expected_clean={},
            expected_records=4,
            quarantine_lines=tuple((f.name, n, MALFORMED_JSON) for n in (1, 2, 3, 4)),
            note="no BOM: the spec decodes per b'\\n' line as UTF-8, no UTF-16 sniffing",
        )
    )

    kind = "utf8_bom_start"
    f = Lines(kind)
    f.good(3)
    out.append(Case(kind, {f.name: b"\xef\xbb\xbf" + f.data()}, {}, dict(f.clean), 3, (), dict(f.clean_at)))

    kind = "utf8_bom_mid_file"
    f = Lines(kind)
    f.good()
    f.add(b"\xef\xbb\xbf" + dumps({"id": f"{kind}-bom", "text": text_of(kind, 99)}), MALFORMED_JSON)
    f.good()
    out.append(case_of(kind, f, note="a BOM is stripped only at file start; json.loads rejects a leading U+FEFF"))
    return out
