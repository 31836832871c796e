"""Hostile landed files, each with the exact outcome the reader spec promises for it.

`hostile_cases()` builds every case in memory (cached; about a second), `land_cases()` writes
them into a partition's landing folder. Each case is a few files named after its `kind`, and
every id and every text in it carries the kind, so all cases can share one partition: no id or
text of one case collides with another's (duplicate_id and duplicate_text are per partition).

Expectations are written from the reader spec (issue 6) and the limits of configs/tiny.yaml
(MIN_CHARS .. MAX_RECORD_BYTES below), never from what the code happens to do. Where the spec
leaves a choice open, the case's `note` says which expectation was chosen.

Nothing here imports aieng_core: the generator is an independent account of the data.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from itertools import islice, product
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

# ---- the limits the expectations assume (configs/tiny.yaml, data section) ----------------
MIN_CHARS = 10
MAX_CHARS = 200_000
MAX_RECORD_BYTES = 1 << 20  # 1 MiB
MAX_FILE_BYTES = 256 << 20  # 256 MiB
STREAM_SAFE_MARKS = 30  # a longer run of combining marks is excessive (Unicode stream-safe format)
MAX_ID_CHARS = 1024

# ---- quarantine reasons (the strings are part of the data contract) -----------------------
MALFORMED_JSON = "malformed_json"
MALFORMED_ROW = "malformed_row"
UNDECODABLE = "undecodable"
AMBIGUOUS_ENCODING = "ambiguous_encoding"
MISSING_FIELD = "missing_field"
WRONG_TYPE = "wrong_type"
DUPLICATE_FIELD = "duplicate_field"
INVALID_ID = "invalid_id"
RECORD_TOO_LARGE = "record_too_large"
UNREADABLE = "unreadable"
EMPTY_TEXT = "empty_text"
EXCESSIVE_COMBINING_MARKS = "excessive_combining_marks"
TOO_SHORT = "too_short"
TOO_LONG = "too_long"
DUPLICATE_ID = "duplicate_id"
DUPLICATE_TEXT = "duplicate_text"
REASONS = (
    MALFORMED_JSON,
    MALFORMED_ROW,
    UNDECODABLE,
    AMBIGUOUS_ENCODING,
    MISSING_FIELD,
    WRONG_TYPE,
    DUPLICATE_FIELD,
    INVALID_ID,
    RECORD_TOO_LARGE,
    UNREADABLE,
    EMPTY_TEXT,
    EXCESSIVE_COMBINING_MARKS,
    TOO_SHORT,
    TOO_LONG,
    DUPLICATE_ID,
    DUPLICATE_TEXT,
)

# What the spec's decoding rule makes of one unit (see spec_verdict).
AS_UTF8, AS_GB18030 = "utf-8", "gb18030"


@dataclass(frozen=True)
class Case:
    kind: str  # short unique name; also the prefix of its file names, ids and texts
    files: dict[str, bytes]  # landed file name -> bytes
    expected_reasons: dict[str, int]  # quarantine reason -> count, over this case's files
    expected_clean: dict[str, str]  # id -> exact clean text
    expected_records: int  # the independent record count (clean + quarantined)
    # Exact (source_file, line, reason) of every quarantined record, sorted, where the spec
    # pins line numbers down; None where it does not (lines after a lost gzip range).
    quarantine_lines: tuple[tuple[str, int, str], ...] | None = None
    # id -> (source_file, line) of clean rows, where pinned down (None: not checked).
    clean_lines: dict[str, tuple[str, int]] | None = None
    # (unit bytes, verdict) pairs the expectations rely on, for the generator's self-check
    # against spec_verdict: AS_UTF8, AS_GB18030, AMBIGUOUS_ENCODING or UNDECODABLE.
    encoding_units: tuple[tuple[bytes, str], ...] = ()
    note: str = ""

    def __post_init__(self) -> None:
        quarantined = sum(self.expected_reasons.values())
        if self.expected_records != quarantined + len(self.expected_clean):
            raise ValueError(
                f"{self.kind}: {self.expected_records} records != {quarantined} quarantined + "
                f"{len(self.expected_clean)} clean"
            )
        if any(count <= 0 for count in self.expected_reasons.values()):
            raise ValueError(f"{self.kind}: reason counts must be positive")
        if self.quarantine_lines is not None:
            if Counter(reason for _, _, reason in self.quarantine_lines) != Counter(self.expected_reasons):
                raise ValueError(f"{self.kind}: quarantine_lines disagree with expected_reasons")

    @property
    def landed_bytes(self) -> int:
        return sum(len(data) for data in self.files.values())


@dataclass(frozen=True)
class OddNameCase:
    """A landed file whose name is not valid UTF-8 (raw_documents snapshots it under an
    escaped name). Kept apart from Case: its name is bytes, and only the landing step sees it."""

    kind: str
    name: bytes
    data: bytes
    expected_reasons: dict[str, int]
    expected_clean: dict[str, str]
    expected_records: int


# ---- the spec's decoding rule, spelled out independently ---------------------------------
def spec_verdict(unit: bytes, fallback: str = "gb18030") -> str:
    """What the spec says decoding one unit (a JSONL line, a CSV physical line, a Parquet
    cell) gives: AS_UTF8, AS_GB18030, AMBIGUOUS_ENCODING or UNDECODABLE."""
    try:
        unit.decode("utf-8")
        return AS_UTF8
    except UnicodeDecodeError:
        pass
    try:
        unit.decode(fallback)
    except UnicodeDecodeError:
        return UNDECODABLE
    inside = outside = 0
    i = 0
    while i < len(unit):
        lead = unit[i]
        if lead < 0x80:
            i += 1
            continue
        trail = unit[i + 1]
        if 0x30 <= trail <= 0x39:
            return AMBIGUOUS_ENCODING  # a four-byte GB18030 sequence
        if 0xA1 <= lead <= 0xFE and 0xA1 <= trail <= 0xFE:
            inside += 1
        else:
            outside += 1
        i += 2
    return AS_GB18030 if outside * 5 <= inside + outside else AMBIGUOUS_ENCODING


# ---- small builders ----------------------------------------------------------------------
def text_of(kind: str, number: int) -> str:
    """A distinct ordinary text for a case: clean as it is, well within the length bounds,
    and free of commas and quotes, so it is one CSV field as it stands."""
    return f"The {kind} case; document {number}: plain words that pass every check."


def good_text(kind: str, number: int) -> str:
    """The text of a generated good record: never equal to any text_of()."""
    return f"The {kind} case; good document {number}: plain words that pass every check."


def dumps(record: Any) -> bytes:
    return json.dumps(record, ensure_ascii=False).encode("utf-8")


class Lines:
    """A landed file built record by record, tracking physical line numbers and outcomes."""

    def __init__(self, kind: str, name: str | None = None, suffix: str = ".jsonl") -> None:
        self.kind = kind
        self.name = name or f"{kind}{suffix}"
        self.lines: list[bytes] = []
        self.clean: dict[str, str] = {}
        self.clean_at: dict[str, tuple[str, int]] = {}
        self.quarantine: list[tuple[str, int, str]] = []
        self.units: list[tuple[bytes, str]] = []
        self.count = 0

    def next_id(self) -> str:
        """Ids of generated good records, "<kind>-g<n>": never equal to a case's own ids."""
        self.count += 1
        return f"{self.kind}-g{self.count}"

    @property
    def next_line(self) -> int:
        return sum(line.count(b"\n") + 1 for line in self.lines) + 1

    def add(
        self, raw: bytes, reason: str | None = None, clean: tuple[str, str] | None = None, unit: str | None = None
    ) -> int:
        """One record of one or more physical lines (raw holds no final newline)."""
        if (reason is None) == (clean is None):
            raise ValueError("a record is either quarantined with a reason or clean, not both or neither")
        if clean is not None and clean[0] in self.clean:
            raise ValueError(f"{clean[0]!r} is already a clean id of {self.name}")
        line = self.next_line
        self.lines.append(raw)
        if reason is not None:
            self.quarantine.append((self.name, line, reason))
        else:
            self.clean[clean[0]] = clean[1]
            self.clean_at[clean[0]] = (self.name, line)
        if unit is not None:
            self.units.append((raw, unit))
        return line

    def blank(self, raw: bytes = b"") -> None:
        """A physical line that is not a record."""
        self.lines.append(raw)

    # JSONL
    def good(self, count: int = 1) -> None:
        for _ in range(count):
            doc_id = self.next_id()
            self.add(
                dumps({"id": doc_id, "text": good_text(self.kind, self.count)}),
                clean=(doc_id, good_text(self.kind, self.count)),
            )

    def record(self, record: dict[str, Any], reason: str | None = None, clean_text: str | None = None) -> None:
        raw = dumps(record)
        if reason is None:
            self.add(raw, clean=(record["id"], record["text"] if clean_text is None else clean_text))
        else:
            self.add(raw, reason)

    # CSV
    def good_rows(self, count: int = 1) -> None:
        for _ in range(count):
            doc_id = self.next_id()
            text = good_text(self.kind, self.count)
            self.add(f"{doc_id},{text}".encode(), clean=(doc_id, text))

    def data(self, final_newline: bool = True) -> bytes:
        return b"\n".join(self.lines) + (b"\n" if final_newline and self.lines else b"")


def case_of(kind: str, *files: Lines, note: str = "", final_newline: bool = True, lines_pinned: bool = True) -> Case:
    clean: dict[str, str] = {}
    clean_at: dict[str, tuple[str, int]] = {}
    quarantine: list[tuple[str, int, str]] = []
    units: list[tuple[bytes, str]] = []
    for f in files:
        clean.update(f.clean)
        clean_at.update(f.clean_at)
        quarantine.extend(f.quarantine)
        units.extend(f.units)
    return Case(
        kind=kind,
        files={f.name: f.data(final_newline) for f in files},
        expected_reasons=dict(Counter(reason for _, _, reason in quarantine)),
        expected_clean=clean,
        expected_records=len(clean) + len(quarantine),
        quarantine_lines=tuple(sorted(quarantine)) if lines_pinned else None,
        clean_lines=clean_at if lines_pinned else None,
        encoding_units=tuple(units),
        note=note,
    )


def gz(data: bytes, level: int = 6) -> bytes:
    """One gzip member, deterministic (mtime 0)."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, 31)
    return compressor.compress(data) + compressor.flush()


def gz_repeated(parts: Iterable[tuple[bytes, int]]) -> bytes:
    """One gzip member holding each (chunk, times) in turn, built in milliseconds even when it
    decompresses to hundreds of MiB: each distinct chunk is deflated once by a fresh
    compressor and ends on a full flush, so its blocks refer to nothing before them and can be
    repeated byte for byte."""
    body = bytearray()
    deflated: dict[bytes, bytes] = {}
    crc = size = 0
    for chunk, times in parts:
        if chunk not in deflated:
            compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
            deflated[chunk] = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)
        for _ in range(times):
            body += deflated[chunk]
            crc = zlib.crc32(chunk, crc)
        size += len(chunk) * times
    body += zlib.compressobj(9, zlib.DEFLATED, -15).flush(zlib.Z_FINISH)  # an empty final block
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + bytes(body) + struct.pack("<II", crc, size & 0xFFFFFFFF)


def parquet_bytes(table: pa.Table, **options: Any) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **options)
    return sink.getvalue().to_pybytes()


def invalid_strings(values: list[bytes]) -> pa.Array:
    """A string column holding exactly these bytes, valid UTF-8 or not."""
    return pa.array(values, pa.binary()).view(pa.string())


# ---- the cases, by family ----------------------------------------------------------------
def _encoding_cases() -> list[Case]:
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


# What cleaning makes of each line-breaking or separating control character (the documented
# rule of aieng_core/data/cleaning.py: line breaks become "\n", the separators a space).
BECOMES = {
    "\r": "\n",
    "\x0b": "\n",
    "\x0c": "\n",
    "\x85": "\n",
    "\u2028": "\n",
    "\u2029": "\n",
    "\x1c": " ",
    "\x1d": " ",
    "\x1e": " ",
    "\x1f": " ",
}
SEPARATOR_KINDS = {
    "ws_lone_cr": "\r",
    "ws_vertical_tab": "\x0b",
    "ws_form_feed": "\x0c",
    "ws_file_sep": "\x1c",
    "ws_group_sep": "\x1d",
    "ws_record_sep": "\x1e",
    "ws_unit_sep": "\x1f",
    "ws_nel": "\x85",
    "ws_line_sep": "\u2028",
    "ws_para_sep": "\u2029",
}


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


def _wide_cases() -> list[Case]:
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


def _text_cases() -> list[Case]:
    out = []
    kind = "special_tokens_literal"
    f = Lines(kind)
    for number, text in enumerate(
        [
            f"A document that mentions <|endoftext|> in the middle, {kind}.",
            f"<|pad|><|pad|> padding tokens written as text, {kind}",
            f"<|endoftext|> {kind} <|pad|>",
        ],
        1,
    ):
        f.record({"id": f"{kind}-{number}", "text": text})
    out.append(case_of(kind, f))

    # Line-breaking and separating controls between two words: they separate, never glue.
    for kind, char in SEPARATOR_KINDS.items():
        f = Lines(kind)
        f.record(
            {"id": f"{kind}-1", "text": f"{kind} alpha{char}beta words"},
            clean_text=f"{kind} alpha{BECOMES[char]}beta words",
        )
        second = f"{kind}{char}{char}second{char} \t{char}record here"
        if BECOMES[char] == "\n":  # two breaks (with only whitespace between) are one paragraph break
            f.record({"id": f"{kind}-2", "text": second}, clean_text=f"{kind}\n\nsecond\n\nrecord here")
        else:
            f.record({"id": f"{kind}-2", "text": second}, clean_text=f"{kind} second record here")
        out.append(
            case_of(kind, f, note="line breaks become \\n, the \\x1c-\\x1f separators a space: words never glue")
        )

    kind = "ws_crlf_in_text"
    f = Lines(kind)
    f.record({"id": f"{kind}-1", "text": f"{kind} crlf\r\nbreak here"}, clean_text=f"{kind} crlf\nbreak here")
    f.record({"id": f"{kind}-2", "text": f"{kind} mixed\r\n\r\n\r\n\rbreaks"}, clean_text=f"{kind} mixed\n\nbreaks")
    out.append(case_of(kind, f, note="CRLF is one line break; 3+ breaks become a paragraph break"))

    kind = "nul_and_c1_controls"
    f = Lines(kind)
    f.record({"id": f"{kind}-1", "text": f"{kind} alpha\u0000beta words"}, clean_text=f"{kind} alphabeta words")
    f.record({"id": f"{kind}-2", "text": f"{kind} gamma\u0080\u009fdelta words"}, clean_text=f"{kind} gammadelta words")
    out.append(case_of(kind, f, note="controls that are not whitespace are removed"))

    kind = "raw_control_in_json_string"
    f = Lines(kind)
    f.good()
    f.add(b'{"id": "raw_control_in_json_string-x", "text": "a raw \x01 byte inside a JSON string"}', MALFORMED_JSON)
    f.add(b'{"id": "raw_control_in_json_string-y", "text": "a raw \t tab inside a JSON string"}', MALFORMED_JSON)
    f.good()
    out.append(case_of(kind, f, note="raw control characters are invalid inside JSON strings: json.loads fails"))

    kind = "invisible_ids"
    f = Lines(kind)
    for number, doc_id in enumerate(["\u200b", "\ufeff", "\x1c", "\u200b\ufeff\x1c"], 1):
        f.record({"id": doc_id, "text": text_of(kind, number)}, MISSING_FIELD)
    f.good()
    out.append(case_of(kind, f))

    kind = "invisible_texts"
    f = Lines(kind)
    for number, text in enumerate(["\u200b", "\ufeff", "\x1c", " \u200b\ufeff\x1c "], 1):
        f.record({"id": f"{kind}-{number}", "text": text}, EMPTY_TEXT)
    f.good()
    out.append(case_of(kind, f))

    kind = "nfc_nfd_ids"
    f = Lines(kind)
    f.record({"id": f"{kind}-caf\u00e9", "text": text_of(kind, 1)})
    f.record({"id": f"{kind}-cafe\u0301", "text": text_of(kind, 2)}, DUPLICATE_ID)
    out.append(case_of(kind, f, note="ids compare after NFC: the NFD spelling of the same id is a duplicate"))

    kind = "nfd_text_normalized"
    f = Lines(kind)
    f.record({"id": f"{kind}-1", "text": f"{kind}: cafe\u0301 and A\u030a"}, clean_text=f"{kind}: caf\u00e9 and \u00c5")
    f.record({"id": f"{kind}-2", "text": f"{kind}: caf\u00e9 and \u00c5"}, DUPLICATE_TEXT)
    out.append(case_of(kind, f, note="texts are compared after cleaning (NFC), so the NFC copy is a duplicate"))

    kind = "lone_surrogates"
    f = Lines(kind)
    f.add(b'{"id": "lone_surrogates-1", "text": "a lone high \\ud800 surrogate escape"}', UNDECODABLE)
    f.add(b'{"id": "lone_surrogates-2", "text": "a lone low \\udc00 surrogate escape"}', UNDECODABLE)
    f.add(b'{"id": "lone_surrogates-\\ud800", "text": "the id holds a lone surrogate escape"}', UNDECODABLE)
    f.add(
        b'{"id": "lone_surrogates-4", "text": "a paired escape \\ud83d\\ude00 is an emoji"}',
        clean=("lone_surrogates-4", "a paired escape \U0001f600 is an emoji"),
    )
    out.append(case_of(kind, f))

    kind = "combining_marks_160k"
    f = Lines(kind)
    f.record({"id": f"{kind}-marks", "text": f"{kind} x" + "\u0301" * 160_000}, EXCESSIVE_COMBINING_MARKS)
    f.good()
    out.append(case_of(kind, f))

    kind = "combining_marks_alternating"
    f = Lines(kind)
    # Two mark classes alternating: canonical reordering of this run is quadratic in NFC.
    f.record({"id": f"{kind}-marks", "text": f"{kind} x" + "\u0301\u0323" * 80_000}, EXCESSIVE_COMBINING_MARKS)
    f.good()
    out.append(case_of(kind, f, note="160,000 marks of two classes; NFC of this run takes ~30 s unless refused first"))

    kind = "combining_marks_boundary"
    f = Lines(kind)
    # U+0332 has no precomposed form with x, so NFC leaves the run length unchanged.
    at_limit = f"{kind} x" + "\u0332" * STREAM_SAFE_MARKS + " at the limit"
    f.record({"id": f"{kind}-1", "text": at_limit})
    f.record(
        {"id": f"{kind}-2", "text": f"{kind} x" + "\u0332" * (STREAM_SAFE_MARKS + 1) + " over it"},
        EXCESSIVE_COMBINING_MARKS,
    )
    out.append(case_of(kind, f))

    kind = "length_bounds"
    f = Lines(kind)
    f.record({"id": f"{kind}-1", "text": "lb-9chars"}, TOO_SHORT)  # 9 characters
    f.record({"id": f"{kind}-2", "text": "lb-10chars"})  # 10
    f.record({"id": f"{kind}-3", "text": "  lb  \t 9ch  "}, TOO_SHORT)  # "lb 9ch" after cleaning
    f.record({"id": f"{kind}-4", "text": "L" * (MAX_CHARS - len(kind)) + kind})  # exactly max_chars
    f.record({"id": f"{kind}-5", "text": "M" * (MAX_CHARS + 1 - len(kind)) + kind}, TOO_LONG)
    out.append(case_of(kind, f))

    kind = "id_limits"
    f = Lines(kind)
    f.record({"id": kind + "-" + "i" * (MAX_ID_CHARS - len(kind) - 1), "text": text_of(kind, 1)})  # 1,024 characters
    f.record({"id": kind + "-" + "j" * (MAX_ID_CHARS - len(kind)), "text": text_of(kind, 2)}, INVALID_ID)  # 1,025
    f.record({"id": f"{kind}-x" + "\u0332" * (STREAM_SAFE_MARKS + 1), "text": text_of(kind, 3)}, INVALID_ID)
    f.record({"id": f"{kind}-y" + "\u0332" * STREAM_SAFE_MARKS, "text": text_of(kind, 4)})
    out.append(case_of(kind, f))

    kind = "duplicates_in_file"
    f = Lines(kind)
    f.record({"id": f"{kind}-1", "text": text_of(kind, 1)})
    f.record({"id": f"{kind}-1", "text": text_of(kind, 2)}, DUPLICATE_ID)
    f.record({"id": f"{kind}-3", "text": text_of(kind, 1)}, DUPLICATE_TEXT)
    f.record(
        {"id": f"{kind}-4", "text": "  " + text_of(kind, 1).replace(" ", "  ")}, DUPLICATE_TEXT
    )  # same after cleaning
    out.append(case_of(kind, f))

    kind = "duplicates_across_files"
    first, second = Lines(kind, f"{kind}-a.jsonl"), Lines(kind, f"{kind}-b.csv")
    first.record({"id": f"{kind}-1", "text": text_of(kind, 1)})
    second.blank(b"id,text")
    second.add(f"{kind}-1,{text_of(kind, 2)}".encode(), DUPLICATE_ID)
    second.add(f"{kind}-3,{text_of(kind, 1)}".encode(), DUPLICATE_TEXT)
    out.append(case_of(kind, first, second))

    kind = "contract_types"
    f = Lines(kind)
    f.record({"id": f"{kind}-1"}, MISSING_FIELD)
    f.record({"id": f"{kind}-2", "text": None}, MISSING_FIELD)
    f.record({"text": text_of(kind, 3)}, MISSING_FIELD)
    f.record({"id": 4, "text": text_of(kind, 4)}, WRONG_TYPE)
    f.record({"id": f"{kind}-5", "text": ["a", "list"]}, WRONG_TYPE)
    f.record({"id": f"{kind}-6", "text": text_of(kind, 6), "source": 6}, WRONG_TYPE)
    f.record(
        {
            "id": f"{kind}-7",
            "text": text_of(kind, 7),
            "source": "web",
            "lang": "en",
            "created_at": "2026-01-01T00:00:00Z",
        }
    )
    out.append(case_of(kind, f))
    return out


def _json_cases() -> list[Case]:
    out = []
    kind = "repeated_contract_keys"
    f = Lines(kind)
    f.good()
    k = kind.encode()
    f.add(b'{"id": "' + k + b'-a", "id": "' + k + b'-b", "text": "two ids in one record here"}', DUPLICATE_FIELD)
    f.add(b'{"id": "' + k + b'-c", "text": "the first text here", "text": "the second text here"}', DUPLICATE_FIELD)
    f.add(b'{"id": "' + k + b'-d", "text": "a text with two sources", "source": "a", "source": "b"}', DUPLICATE_FIELD)
    f.add(b'{"id": "' + k + b'-e", "text": "a text with two langs", "lang": "en", "lang": "en"}', DUPLICATE_FIELD)
    f.add(
        b'{"id": "' + k + b'-f", "text": "a text with two times", "created_at": null, "created_at": "2026-01-01"}',
        DUPLICATE_FIELD,
    )
    f.add(
        b'{"id": "' + k + b'-g", "\\u0069d": "' + k + b'-h", "text": "an escaped key spells id again"}', DUPLICATE_FIELD
    )
    out.append(case_of(kind, f, note="a key written with an escape is the same key once decoded"))

    kind = "repeated_ignored_keys"
    f = Lines(kind)
    k = kind.encode()
    f.add(
        b'{"id": "' + k + b'-1", "text": "ignored key twice at top level here", "extra": 1, "extra": 2}',
        clean=(f"{kind}-1", "ignored key twice at top level here"),
    )
    f.add(
        b'{"id": "'
        + k
        + b'-2", "text": "nested repeated contract names here", "meta": {"id": 1, "id": 2, "text": "a", "text": "b"}}',
        clean=(f"{kind}-2", "nested repeated contract names here"),
    )
    f.add(
        b'{"\\u0074ext": "a text under an escaped key here", "id": "' + k + b'-3"}',
        clean=(f"{kind}-3", "a text under an escaped key here"),
    )
    out.append(case_of(kind, f))

    kind = "deep_nesting"
    f = Lines(kind)
    f.good()
    f.add(b"[" * 100_000 + b"]" * 100_000, MALFORMED_JSON)
    f.add(b'{"id": "deep_nesting-open", "text": ' + b"[" * 100_000, MALFORMED_JSON)
    f.good()
    out.append(case_of(kind, f))

    kind = "deep_nesting_ignored_field"
    f = Lines(kind)
    f.add(
        b'{"id": "'
        + kind.encode()
        + b'-1", "text": "deep value in an ignored field", "deep": '
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}",
        MALFORMED_JSON,
    )
    f.add(
        b'{"deep": '
        + b'{"a": ' * 50_000
        + b"0"
        + b"}" * 50_000
        + b', "text": "deep object before the fields", "id": "'
        + kind.encode()
        + b'-2"}',
        MALFORMED_JSON,
    )
    f.add(
        b'{"id": "'
        + kind.encode()
        + b'-3", "text": "a 200-deep value in an ignored field", "deep": '
        + b"[" * 200
        + b"]" * 200
        + b"}",
        clean=(f"{kind}-3", "a 200-deep value in an ignored field"),
    )
    f.good()
    out.append(
        case_of(
            kind,
            f,
            note="too deep to parse is malformed_json even in an ignored field; a parseable depth never matters",
        )
    )

    big = b"9" * 5000
    kind = "huge_number_ignored"
    f = Lines(kind)
    f.add(
        b'{"id": "' + kind.encode() + b'-1", "text": "a 5,000-digit number sits beside me", "n": ' + big + b"}",
        clean=(f"{kind}-1", "a 5,000-digit number sits beside me"),
    )
    f.add(
        b'{"n": -' + big + b'.5e3, "id": "' + kind.encode() + b'-2", "text": "a huge float sits before me here"}',
        clean=(f"{kind}-2", "a huge float sits before me here"),
    )
    out.append(case_of(kind, f))

    kind = "huge_number_contract"
    f = Lines(kind)
    f.add(b'{"id": ' + big + b', "text": "my id is a 5,000-digit number"}', WRONG_TYPE)
    f.add(b'{"id": "' + kind.encode() + b'-2", "text": ' + big + b"}", WRONG_TYPE)
    f.good()
    out.append(
        case_of(kind, f, note="Python's int-string limit (4,300 digits) must not turn these into malformed_json")
    )

    kind = "not_an_object"
    f = Lines(kind)
    for raw in (b'["an", "array"]', b'"a bare string"', b"42", b"null", b"true", b"NaN"):
        f.add(raw, MALFORMED_ROW)
    f.good()
    out.append(case_of(kind, f))

    kind = "nan_and_infinity"
    f = Lines(kind)
    k = kind.encode()
    f.add(
        b'{"id": "' + k + b'-1", "text": "a NaN sits in an ignored field", "score": NaN, "w": -Infinity}',
        clean=(f"{kind}-1", "a NaN sits in an ignored field"),
    )
    f.add(b'{"id": "' + k + b'-2", "text": NaN}', WRONG_TYPE)
    f.add(b'{"id": Infinity, "text": "my id is Infinity, a float"}', WRONG_TYPE)
    out.append(
        case_of(
            kind,
            f,
            note="json.loads accepts NaN/Infinity, so they are numbers: ignored, or wrong_type in a contract field",
        )
    )

    kind = "malformed_json_variety"
    f = Lines(kind)
    f.good()
    k = kind.encode()
    for raw in (
        b'{"id": "' + k + b'-a", "text": "cut off',
        b'{"id": "' + k + b'-b", "text": "trailing comma",}',
        b'{"id": "' + k + b'-c", "text": "two objects"} {"id": "x"}',
        b"{'id': 'single', 'text': 'quotes'}",
        b"\x00",
        "\u3000".encode(),  # not ASCII whitespace: not a blank line
        b"\xc2\xa0 \xc2\xa0",
    ):
        f.add(raw, MALFORMED_JSON)
    f.good()
    out.append(case_of(kind, f, note="blank means ASCII whitespace only; U+3000 and NBSP lines are records"))

    kind = "blank_lines_only"
    out.append(Case(kind, {f"{kind}.jsonl": b"\n \n\t\r\n\x0b\x0c\n\r\n   \n"}, {}, {}, 0, (), {}))

    kind = "blank_and_crlf_lines"
    f = Lines(kind)
    f.blank(b"")
    f.add(dumps({"id": f"{kind}-1", "text": text_of(kind, 1)}) + b"\r", clean=(f"{kind}-1", text_of(kind, 1)))
    f.blank(b" \t\x0b\x0c\r")
    f.add(b"  " + dumps({"id": f"{kind}-2", "text": text_of(kind, 2)}) + b" \t", clean=(f"{kind}-2", text_of(kind, 2)))
    f.add(dumps({"id": f"{kind}-3", "text": text_of(kind, 3)}), clean=(f"{kind}-3", text_of(kind, 3)))
    out.append(case_of(kind, f, final_newline=False, note="the last record has no final newline"))

    kind = "record_size_limit"
    f = Lines(kind)
    f.good()
    over = MAX_RECORD_BYTES + 4096
    head = b'{"id": "' + kind.encode() + b'-big", "text": "'
    f.add(head + b"o" * (over - len(head) - 2) + b'"}', RECORD_TOO_LARGE)
    under = MAX_RECORD_BYTES - 8192
    head = b'{"id": "' + kind.encode() + b'-ok", "text": "fits under the record limit", "pad": "'
    f.add(head + b"p" * (under - len(head) - 2) + b'"}', clean=(f"{kind}-ok", "fits under the record limit"))
    f.good()
    out.append(
        case_of(
            kind, f, note="lines 4 KiB over and 8 KiB under the limit, so whether the newline counts does not matter"
        )
    )
    return out


def _wide_keys_case() -> Case:
    """64 rows of 100,000 keys each (~800 KB a line, under the 1 MiB record limit), gzipped."""
    kind = "gz_wide_rows"
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    keys = ",".join(f'"{a}{b}{c}":0' for a, b, c in islice(product(alphabet, repeat=3), 100_000))
    assert keys.count(":") == 100_000
    keys_bytes = keys.encode()
    parts, clean = [], {}
    for number in range(1, 65):
        doc_id, text = f"{kind}-{number}", text_of(kind, number)
        fields = f'"id": "{doc_id}", "text": "{text}"'.encode()
        if number % 2:  # contract fields first
            parts += [(b"{" + fields + b",", 1), (keys_bytes, 1), (b"}\n", 1)]
        else:  # contract fields after 100,000 others
            parts += [(b"{", 1), (keys_bytes, 1), (b"," + fields + b"}\n", 1)]
        clean[doc_id] = text
    name = f"{kind}.jsonl.gz"
    return Case(
        kind,
        {name: gz_repeated(parts)},
        {},
        clean,
        64,
        (),
        {d: (name, n) for n, d in enumerate(clean, 1)},
        note="lines of ~800 KB each",
    )


def _csv_cases() -> list[Case]:
    out = []

    def csv_file(kind: str, header: bytes = b"id,text", name: str | None = None) -> Lines:
        f = Lines(kind, name, suffix=".csv")
        f.blank(header)
        return f

    kind = "csv_quote_then_tail"
    f = csv_file(kind)
    f.good_rows()
    f.add(f'{kind}-x,"quoted" tail after the quote'.encode(), MALFORMED_ROW)
    f.good_rows()
    out.append(case_of(kind, f))

    kind = "csv_field_count"
    f = csv_file(kind)
    f.good_rows()
    f.add(f"{kind}-x,one field too many,here".encode(), MALFORMED_ROW)
    f.add(f"{kind}-y".encode(), MALFORMED_ROW)
    f.good_rows()
    out.append(case_of(kind, f))

    kind = "csv_repeated_contract_column"
    f = csv_file(kind, b"id,text,id")
    for number in (1, 2, 3):
        f.add(f"{kind}-{number},{text_of(kind, number)},{kind}-{number}".encode(), DUPLICATE_FIELD)
    out.append(case_of(kind, f))

    kind = "csv_repeated_ignored_column"
    f = csv_file(kind, b"id,text,note,note")
    for number in (1, 2):
        text = text_of(kind, number)
        f.add(f"{kind}-{number},{text},a,b".encode(), clean=(f"{kind}-{number}", text))
    out.append(case_of(kind, f))

    kind = "csv_blank_first_lines"
    f = Lines(kind, suffix=".csv")
    f.blank(b"")
    f.blank(b" \t\r")
    f.blank(b"id,text")
    f.good_rows(2)
    out.append(case_of(kind, f))

    kind = "csv_header_only"
    out.append(Case(kind, {f"{kind}.csv": b"id,text\n"}, {}, {}, 0, (), {}))
    kind = "csv_header_only_no_newline"
    out.append(Case(kind, {f"{kind}.csv": b"id,text"}, {}, {}, 0, (), {}))
    kind = "csv_blank_lines_only"
    out.append(Case(kind, {f"{kind}.csv": b"\n\r\n \t \n"}, {}, {}, 0, (), {}))

    kind = "csv_multiline_with_gbk"
    f = csv_file(kind)
    f.add(
        f'{kind}-1,"first line\nsecond line\nthird line of one field, {kind}"'.encode(),
        clean=(f"{kind}-1", f"first line\nsecond line\nthird line of one field, {kind}"),
    )
    f.add(
        f"{kind}-2,数据清洗的中文文本内容 {kind}".encode("gbk"),
        clean=(f"{kind}-2", f"数据清洗的中文文本内容 {kind}"),
        unit=AS_GB18030,
    )
    f.add(
        f'{kind}-3,"UTF-8 第一行文本\n'.encode() + f'第二行中文内容 {kind}"'.encode("gbk"),
        clean=(f"{kind}-3", f"UTF-8 第一行文本\n第二行中文内容 {kind}"),
    )
    f.good_rows()
    out.append(case_of(kind, f, note="each physical line decoded on its own, then the quoted field spans them"))

    kind = "csv_crlf"
    f = Lines(kind, suffix=".csv")
    f.blank(b"id,text\r")
    for number in (1, 2):
        text = text_of(kind, number)
        f.add(f"{kind}-{number},{text}\r".encode(), clean=(f"{kind}-{number}", text))
    f.blank(b"\r")
    f.add(f'{kind}-3,"quoted, with a comma"\r'.encode(), clean=(f"{kind}-3", "quoted, with a comma"))
    out.append(case_of(kind, f))

    kind = "csv_bom_spaced_header"
    f = Lines(kind, suffix=".csv")
    f.blank(b"\xef\xbb\xbf id , text ,source")
    f.good_rows(2)
    f.lines[1] += b",web"
    f.lines[2] += b","
    out.append(case_of(kind, f))

    kind = "csv_line_encodings"
    f = csv_file(kind)
    f.good_rows()
    f.add(
        f"{kind}-gbk,中文数据清洗测试文本 {kind}".encode("gbk"),
        clean=(f"{kind}-gbk", f"中文数据清洗测试文本 {kind}"),
        unit=AS_GB18030,
    )
    f.add(f"{kind}-latin,Grüezi from Zürich {kind}".encode("latin-1"), AMBIGUOUS_ENCODING, unit=AMBIGUOUS_ENCODING)
    f.add(f"{kind}-junk,".encode() + b"junk \xff\xfe bytes", UNDECODABLE, unit=UNDECODABLE)
    f.good_rows()
    out.append(case_of(kind, f))

    kind = "csv_separator_controls"
    f = csv_file(kind)
    for number, char in enumerate(["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\u2028", "\u2029"], 1):
        f.add(
            f"{kind}-{number},{kind} {number} alpha{char}beta".encode(),
            clean=(f"{kind}-{number}", f"{kind} {number} alpha{BECOMES[char]}beta"),
        )
    f.add(f"{kind}-nul,{kind} alpha\x00beta".encode(), clean=(f"{kind}-nul", f"{kind} alphabeta"))
    out.append(
        case_of(kind, f, note="none of these splits a CSV line (only b'\\n' does); cleaning maps them as in BECOMES")
    )

    kind = "csv_lone_cr"
    f = csv_file(kind)
    f.add(f"{kind}-1,unquoted alpha\rbeta".encode(), MALFORMED_ROW)
    f.add(f'{kind}-2,"{kind} quoted alpha\rbeta"'.encode(), clean=(f"{kind}-2", f"{kind} quoted alpha\nbeta"))
    out.append(case_of(kind, f, note="csv strict mode rejects a CR inside an unquoted field; inside quotes it is text"))

    kind = "csv_quotes_inside"
    f = csv_file(kind)
    f.add(f'{kind}-1,say "hi" now {kind}'.encode(), clean=(f"{kind}-1", f'say "hi" now {kind}'))
    f.add(
        f'{kind}-2,"He said ""hi"", then left, {kind}"'.encode(),
        clean=(f"{kind}-2", f'He said "hi", then left, {kind}'),
    )
    out.append(case_of(kind, f))

    kind = "csv_unterminated_quote"
    f = csv_file(kind)
    f.good_rows(2)
    f.add(f'{kind}-x,"an opening quote\nthat never closes\nbefore the end'.encode(), MALFORMED_ROW)
    out.append(case_of(kind, f, note="an unclosed quote consumes every line to the end of the file: one malformed_row"))

    kind = "csv_record_size_limit"
    f = csv_file(kind)
    f.good_rows()
    f.add(f'{kind}-big,"'.encode() + (b"q" * 1000 + b"\n") * 1100 + b'end"', RECORD_TOO_LARGE)
    f.good_rows()
    f.add(f"{kind}-long,".encode() + b"r" * (MAX_RECORD_BYTES + 4096), RECORD_TOO_LARGE)
    f.good_rows()
    out.append(
        case_of(
            kind, f, note="a quoted record over the limit is skipped to its closing quote; parsing resumes after it"
        )
    )

    kind = "csv_missing_text_column"
    f = csv_file(kind, b"id,body")
    for number in (1, 2):
        f.add(f"{kind}-{number},{text_of(kind, number)}".encode(), MISSING_FIELD)
    out.append(case_of(kind, f))

    kind = "csv_empty_cells"
    f = csv_file(kind, b"id,text,source")
    f.add(f",{text_of(kind, 1)},web".encode(), MISSING_FIELD)
    f.add(f"{kind}-2,,web".encode(), EMPTY_TEXT)
    f.add(f'{kind}-3,"   ",web'.encode(), EMPTY_TEXT)
    f.add(f"{kind}-4,{text_of(kind, 4)},".encode(), clean=(f"{kind}-4", text_of(kind, 4)))
    out.append(case_of(kind, f))

    kind = "csv_numeric_id"
    f = csv_file(kind)
    f.add(f"900100200,{text_of(kind, 1)}".encode(), clean=("900100200", text_of(kind, 1)))
    f.add(f"0900100200,{text_of(kind, 2)}".encode(), clean=("0900100200", text_of(kind, 2)))
    out.append(case_of(kind, f, note="CSV cells are strings: a numeric-looking id is a string id, leading zero kept"))
    return out


def _empty_cases() -> list[Case]:
    return [
        Case("empty_jsonl", {"empty_jsonl.jsonl": b""}, {}, {}, 0, (), {}),
        Case("empty_csv", {"empty_csv.csv": b""}, {}, {}, 0, (), {}),
        Case("empty_jsonl_gz", {"empty_jsonl_gz.jsonl.gz": gz(b"")}, {}, {}, 0, (), {}),
        Case("empty_csv_gz", {"empty_csv_gz.csv.gz": gz(b"")}, {}, {}, 0, (), {}),
    ]


def _gzip_cases() -> list[Case]:
    out = []

    def jsonl_lines(kind: str, start: int, count: int) -> tuple[bytes, dict[str, str]]:
        clean = {f"{kind}-{n}": text_of(kind, n) for n in range(start, start + count)}
        return b"".join(dumps({"id": i, "text": t}) + b"\n" for i, t in clean.items()), clean

    kind = "gz_truncated"
    kept, clean = jsonl_lines(kind, 1, 30)
    rest, _ = jsonl_lines(kind, 31, 30)
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    flushed = compressor.compress(kept) + compressor.flush(zlib.Z_FULL_FLUSH)
    whole = flushed + compressor.compress(rest) + compressor.flush()
    out.append(
        Case(
            kind,
            {f"{kind}.jsonl.gz": whole[: len(flushed) + 4]},
            {UNREADABLE: 1},
            clean,
            31,
            note="cut 4 bytes after a full flush: exactly the first 30 lines decompress",
        )
    )

    kind = "gz_damaged_member"
    members, clean = [], {}
    for index in range(5):
        data, lines = jsonl_lines(kind, index * 20 + 1, 20)
        member = bytearray(gz(data))
        if index == 2:
            member[10] |= 0b110  # BTYPE 11: an invalid deflate block, the member yields nothing
        else:
            clean.update(lines)
        members.append(bytes(member))
    out.append(
        Case(
            kind,
            {f"{kind}.jsonl.gz": b"".join(members)},
            {UNREADABLE: 1},
            clean,
            81,
            note="5 members of 20 whole lines; the 3rd is damaged at its first deflate byte",
        )
    )

    kind = "gz_damaged_member_csv"
    members, clean = [], {}
    for index in range(4):
        rows = {f"{kind}-{n}": text_of(kind, n) for n in range(index * 10 + 1, index * 10 + 11)}
        data = (b"id,text\n" if index == 0 else b"") + b"".join(f"{i},{t}\n".encode() for i, t in rows.items())
        member = bytearray(gz(data))
        if index == 1:
            member[10] |= 0b110
        else:
            clean.update(rows)
        members.append(bytes(member))
    out.append(Case(kind, {f"{kind}.csv.gz": b"".join(members)}, {UNREADABLE: 1}, clean, 31))

    kind = "gz_member_splits_line"
    data, clean = jsonl_lines(kind, 1, 12)
    cuts = [0, 37, 500, 501, len(data) - 1, len(data)]
    name = f"{kind}.jsonl.gz"
    out.append(
        Case(
            kind,
            {name: b"".join(gz(data[a:b]) for a, b in zip(cuts, cuts[1:]))},
            {},
            clean,
            12,
            (),
            {i: (name, n) for n, i in enumerate(clean, 1)},
        )
    )

    kind = "gz_zero_padding"
    data, clean = jsonl_lines(kind, 1, 5)
    name = f"{kind}.jsonl.gz"
    out.append(
        Case(
            kind,
            {name: gz(data) + b"\x00" * 1024},
            {},
            clean,
            5,
            (),
            {i: (name, n) for n, i in enumerate(clean, 1)},
            note="zero padding after the last member is ignored, as GNU gzip does",
        )
    )

    kind = "gz_trailing_garbage"
    data, clean = jsonl_lines(kind, 1, 5)
    out.append(
        Case(
            kind,
            {f"{kind}.jsonl.gz": gz(data) + b"this is not gzip data at all\n"},
            {UNREADABLE: 1},
            clean,
            6,
            note="non-zero bytes after the last member are a damaged range",
        )
    )

    kind = "gz_not_gzip"
    data, _ = jsonl_lines(kind, 1, 3)
    out.append(
        Case(
            kind, {f"{kind}.jsonl.gz": data}, {UNREADABLE: 1}, {}, 1, note="a plain file named .gz is one damaged range"
        )
    )

    kind = "gz_bomb_line"
    first, second = (f"{kind}-1", text_of(kind, 1)), (f"{kind}-3", text_of(kind, 3))
    name = f"{kind}.jsonl.gz"
    bomb = gz_repeated(
        [
            (dumps({"id": first[0], "text": first[1]}) + b'\n{"id": "' + kind.encode() + b'-2", "text": "', 1),
            (b"a" * (1 << 20), 200),
            (b'"}\n' + dumps({"id": second[0], "text": second[1]}) + b"\n", 1),
        ]
    )
    out.append(
        Case(
            kind,
            {name: bomb},
            {RECORD_TOO_LARGE: 1},
            dict([first, second]),
            3,
            ((name, 2, RECORD_TOO_LARGE),),
            {first[0]: (name, 1), second[0]: (name, 3)},
            note="a 200 MiB line in ~200 KB",
        )
    )

    kind = "gz_over_max_file_bytes"
    first = (f"{kind}-1", text_of(kind, 1))
    blank_mib = (b" " * 1023 + b"\n") * 1024
    data = gz_repeated(
        [
            (dumps({"id": first[0], "text": first[1]}) + b"\n", 1),
            (blank_mib, 300),
            (dumps({"id": f"{kind}-2", "text": text_of(kind, 2)}) + b"\n", 1),
        ]
    )
    out.append(
        Case(
            kind,
            {f"{kind}.jsonl.gz": data},
            {UNREADABLE: 1},
            dict([first]),
            2,
            note="300 MiB of blank lines then a record: the rest past 256 MiB is one unreadable",
        )
    )

    out.append(_wide_keys_case())

    kind = "gz_mixed_encodings_csv"
    f = Lines(kind, suffix=".csv.gz")
    f.blank(b"id,text")
    f.good_rows()
    f.add(
        f"{kind}-gbk,中文数据压缩文件测试 {kind}".encode("gbk"),
        clean=(f"{kind}-gbk", f"中文数据压缩文件测试 {kind}"),
        unit=AS_GB18030,
    )
    f.add(f"{kind}-bad,".encode() + b"\xff\xfe\xfd", UNDECODABLE, unit=UNDECODABLE)
    case = case_of(kind, f)
    out.append(
        Case(
            kind,
            {f.name: gz(f.data())},
            case.expected_reasons,
            case.expected_clean,
            case.expected_records,
            case.quarantine_lines,
            case.clean_lines,
            case.encoding_units,
        )
    )
    return out


def _parquet_cases() -> list[Case]:
    out = []

    def docs(kind: str, count: int) -> tuple[list[str], list[str]]:
        return [f"{kind}-{n}" for n in range(1, count + 1)], [text_of(kind, n) for n in range(1, count + 1)]

    def simple(
        kind: str, table: pa.Table, reasons_at: dict[int, str] | None = None, note: str = "", **options: Any
    ) -> Case:
        """A Parquet case whose rows are clean unless reasons_at names them (1-based rows)."""
        reasons_at = reasons_at or {}
        name = f"{kind}.parquet"
        rows = table.num_rows
        ids = table.column("id").to_pylist()
        clean = {ids[r - 1]: table.column("text")[r - 1].as_py() for r in range(1, rows + 1) if r not in reasons_at}
        return Case(
            kind,
            {name: parquet_bytes(table, **options)},
            dict(Counter(reasons_at.values())),
            clean,
            rows,
            tuple(sorted((name, r, reason) for r, reason in reasons_at.items())),
            {ids[r - 1]: (name, r) for r in range(1, rows + 1) if r not in reasons_at},
            note=note,
        )

    kind = "pq_timestamp_out_of_range_ignored"
    ids, texts = docs(kind, 3)
    out.append(
        simple(
            kind, pa.table({"id": ids, "text": texts, "seen": pa.array([0, 10**12, 253402300800], pa.timestamp("s"))})
        )
    )

    kind = "pq_timestamp_out_of_range_created_at"
    ids, texts = docs(kind, 3)
    created = pa.array([1_767_225_600, 10**12, -(10**12)], pa.timestamp("s"))  # 2026-01-01, year ~33658, year ~-29719
    out.append(
        simple(kind, pa.table({"id": ids, "text": texts, "created_at": created}), {2: WRONG_TYPE, 3: WRONG_TYPE})
    )

    kind = "pq_unknown_timezone"
    ids, texts = docs(kind, 2)
    out.append(
        simple(
            kind,
            pa.table({"id": ids, "text": texts, "seen": pa.array([1, 2], pa.timestamp("us", tz="Mars/Olympus_Mons"))}),
        )
    )

    kind = "pq_binary_hash_column"
    ids, texts = docs(kind, 3)
    hashes = [bytes(range(n, n + 32)) for n in (200, 0, 128)]
    out.append(
        simple(
            kind,
            pa.table(
                {
                    "id": ids,
                    "text": texts,
                    "sha256": pa.array(hashes, pa.binary()),
                    "fixed": pa.array(hashes, pa.binary(32)),
                }
            ),
        )
    )

    kind = "pq_nested_columns"
    ids, texts = docs(kind, 2)
    nested = pa.table(
        {
            "id": ids,
            "meta": pa.array([{"a": 1, "b": [1, 2]}, {"a": None, "b": []}]),
            "tags": pa.array([["x", "y"], None]),
            "attrs": pa.array([[("k", "v")], []], pa.map_(pa.string(), pa.string())),
            "text": texts,
        }
    )
    out.append(simple(kind, nested))

    kind = "pq_invalid_utf8_cells"
    ids = [f"{kind}-{n}" for n in range(1, 6)]
    cells = [
        text_of(kind, 1).encode(),
        b"\xff\xfe not text at all",
        f"Grüezi from Zürich {kind}".encode("latin-1"),
        f"中文数据清洗测试文本 {kind}".encode("gbk"),
        text_of(kind, 5).encode(),
    ]
    name = f"{kind}.parquet"
    out.append(
        Case(
            kind,
            {name: parquet_bytes(pa.table({"id": ids, "text": invalid_strings(cells)}))},
            {UNDECODABLE: 1, AMBIGUOUS_ENCODING: 1},
            {ids[0]: text_of(kind, 1), ids[3]: f"中文数据清洗测试文本 {kind}", ids[4]: text_of(kind, 5)},
            5,
            ((name, 2, UNDECODABLE), (name, 3, AMBIGUOUS_ENCODING)),
            {ids[0]: (name, 1), ids[3]: (name, 4), ids[4]: (name, 5)},
            encoding_units=((cells[1], UNDECODABLE), (cells[2], AMBIGUOUS_ENCODING), (cells[3], AS_GB18030)),
        )
    )

    kind = "pq_invalid_utf8_id"
    name = f"{kind}.parquet"
    ids_raw = [f"{kind}-1".encode(), f"{kind}-\xff".encode("latin-1") + b"\xfe"]
    out.append(
        Case(
            kind,
            {
                name: parquet_bytes(
                    pa.table({"id": invalid_strings(ids_raw), "text": [text_of(kind, 1), text_of(kind, 2)]})
                )
            },
            {UNDECODABLE: 1},
            {f"{kind}-1": text_of(kind, 1)},
            2,
            ((name, 2, UNDECODABLE),),
            {f"{kind}-1": (name, 1)},
        )
    )

    for kind, compression in (("pq_damaged_page", "NONE"), ("pq_damaged_page_snappy", "snappy")):
        out.append(_damaged_parquet(kind, compression))

    kind = "pq_no_footer"
    ids, texts = docs(kind, 20)
    whole = parquet_bytes(pa.table({"id": ids, "text": texts}), row_group_size=5)
    name = f"{kind}.parquet"
    out.append(Case(kind, {name: whole[: len(whole) - 12]}, {UNREADABLE: 1}, {}, 1, ((name, 0, UNREADABLE),)))

    kind = "pq_empty_file"
    out.append(Case(kind, {f"{kind}.parquet": b""}, {UNREADABLE: 1}, {}, 1, ((f"{kind}.parquet", 0, UNREADABLE),)))

    kind = "pq_not_parquet"
    name = f"{kind}.parquet"
    out.append(
        Case(
            kind,
            {name: b"PAR1 this is a text file, not Parquet PAR1"},
            {UNREADABLE: 1},
            {},
            1,
            ((name, 0, UNREADABLE),),
        )
    )

    kind = "pq_duplicate_text_column"
    ids, texts = docs(kind, 3)
    table = pa.Table.from_arrays(
        [pa.array(ids), pa.array(texts), pa.array([t + " again" for t in texts])], names=["id", "text", "text"]
    )
    name = f"{kind}.parquet"
    out.append(
        Case(
            kind,
            {name: parquet_bytes(table)},
            {DUPLICATE_FIELD: 3},
            {},
            3,
            tuple((name, r, DUPLICATE_FIELD) for r in (1, 2, 3)),
        )
    )

    kind = "pq_duplicate_ignored_column"
    ids, texts = docs(kind, 2)
    table = pa.Table.from_arrays(
        [pa.array(ids), pa.array(texts), pa.array([1, 2]), pa.array(["a", "b"])], names=["id", "text", "extra", "extra"]
    )
    out.append(simple(kind, table))

    kind = "pq_integer_id"
    texts = [text_of(kind, n) for n in (1, 2, 3)]
    name = f"{kind}.parquet"
    out.append(
        Case(
            kind,
            {name: parquet_bytes(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "text": texts}))},
            {WRONG_TYPE: 3},
            {},
            3,
            tuple((name, r, WRONG_TYPE) for r in (1, 2, 3)),
        )
    )

    kind = "pq_missing_text_column"
    ids, texts = docs(kind, 2)
    name = f"{kind}.parquet"
    out.append(
        Case(
            kind,
            {name: parquet_bytes(pa.table({"id": ids, "body": texts}))},
            {MISSING_FIELD: 2},
            {},
            2,
            ((name, 1, MISSING_FIELD), (name, 2, MISSING_FIELD)),
        )
    )

    kind = "pq_nulls"
    ids, texts = docs(kind, 3)
    name = f"{kind}.parquet"
    table = pa.table(
        {"id": pa.array([None, ids[1], ids[2]], pa.string()), "text": pa.array([texts[0], None, texts[2]], pa.string())}
    )
    out.append(
        Case(
            kind,
            {name: parquet_bytes(table)},
            {MISSING_FIELD: 2},
            {ids[2]: texts[2]},
            3,
            ((name, 1, MISSING_FIELD), (name, 2, MISSING_FIELD)),
            {ids[2]: (name, 3)},
        )
    )

    kind = "pq_zero_rows"
    out.append(
        Case(
            kind,
            {
                f"{kind}.parquet": parquet_bytes(
                    pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())})
                )
            },
            {},
            {},
            0,
            (),
            {},
        )
    )

    kind = "pq_string_variants"
    ids, texts = docs(kind, 4)
    table = pa.table(
        {
            "id": pa.array(ids, pa.large_string()),
            "text": pa.array(texts, pa.string()).dictionary_encode(),
            "lang": pa.array(["en"] * 4, pa.large_string()),
        }
    )
    out.append(simple(kind, table, note="large_string ids, a dictionary-typed text column"))

    kind = "pq_created_at_types"
    ids, texts = docs(kind, 2)
    out.append(
        simple(
            kind,
            pa.table(
                {
                    "id": ids,
                    "text": texts,
                    "created_at": pa.array([1_767_225_600_000_000, 0], pa.timestamp("us", tz="UTC")),
                }
            ),
        )
    )
    kind = "pq_created_at_date"
    ids, texts = docs(kind, 2)
    out.append(simple(kind, pa.table({"id": ids, "text": texts, "created_at": pa.array([20454, 0], pa.date32())})))
    return out


def damaged_page_location(data: bytes, row_group: int, column: str) -> tuple[int, int]:
    """(data page offset, total compressed size) of one column chunk."""
    meta = pq.ParquetFile(pa.BufferReader(data)).metadata
    group = meta.row_group(row_group)
    for index in range(group.num_columns):
        chunk = group.column(index)
        if chunk.path_in_schema == column:
            return chunk.data_page_offset, chunk.total_compressed_size
    raise KeyError(column)


def row_group_unreadable(data: bytes, row_group: int) -> bool:
    """Whether pyarrow fails on the row group itself (not merely on a value's UTF-8)."""
    schema = pa.schema([("id", pa.binary()), ("text", pa.binary())])
    try:
        pq.ParquetFile(pa.BufferReader(data)).read_row_group(row_group, columns=["id", "text"]).cast(schema)
    except (OSError, pa.ArrowException):
        return True
    return False


def _damaged_parquet(kind: str, compression: str) -> Case:
    """5 row groups of 10 rows; the text page of row group 3 (rows 21-30) is damaged."""
    ids = [f"{kind}-{n}" for n in range(1, 51)]
    texts = [text_of(kind, n) for n in range(1, 51)]
    whole = parquet_bytes(
        pa.table({"id": ids, "text": texts}), row_group_size=10, compression=compression, use_dictionary=False
    )
    offset, size = damaged_page_location(whole, 2, "text")
    if compression == "NONE":
        damaged = bytearray(whole)
        damaged[offset : offset + 6] = b"\xff" * 6  # the page header no longer parses
    else:
        # A byte of the snappy payload, chosen (deterministically) where snappy itself fails.
        for back in range(8, size):
            damaged = bytearray(whole)
            damaged[offset + size - back] ^= 0xFF
            if row_group_unreadable(bytes(damaged), 2):
                break
        else:
            raise AssertionError("no damaging byte found")
    name = f"{kind}.parquet"
    lost = range(21, 31)
    return Case(
        kind,
        {name: bytes(damaged)},
        {UNREADABLE: 10},
        {ids[r - 1]: texts[r - 1] for r in range(1, 51) if r not in lost},
        50,
        tuple((name, r, UNREADABLE) for r in lost),
        {ids[r - 1]: (name, r) for r in range(1, 51) if r not in lost},
        note="each lost row is one unreadable record; reading resumes at row group 4",
    )


@lru_cache(maxsize=1)
def hostile_cases() -> list[Case]:
    """Every case; built once per process (treat the result as read-only)."""
    cases = [
        *_encoding_cases(),
        *_wide_cases(),
        *_text_cases(),
        *_json_cases(),
        *_csv_cases(),
        *_empty_cases(),
        *_gzip_cases(),
        *_parquet_cases(),
    ]
    kinds = [case.kind for case in cases]
    duplicated = sorted(kind for kind, count in Counter(kinds).items() if count > 1)
    if duplicated:
        raise ValueError(f"kinds used twice: {duplicated}")
    return cases


def odd_name_case() -> OddNameCase:
    kind = "odd_name"
    records = {f"{kind}-{n}": text_of(kind, n) for n in (1, 2)}
    data = b"".join(dumps({"id": i, "text": t}) + b"\n" for i, t in records.items())
    return OddNameCase(kind, b"odd_name-\xff\xfe-latin1-caf\xe9.jsonl", data, {}, records, 2)


# Entries raw_documents must skip (listed in ignored_files, never read): name -> what it is.
IGNORED_ENTRIES = {
    ".hidden_case.jsonl": "hidden file",
    "notes_case.txt": "other suffix",
    "link_case.jsonl": "symlink to a landed file",
    "dir_case.jsonl": "directory",
    "fifo_case.jsonl": "named pipe (reading it would block forever)",
}


def land_cases(home: Path, partition: str, cases: Iterable[Case], extras: bool = False) -> Path:
    """Write every case's files into home/raw/<partition>/; with extras, also the odd-named
    file and the entries raw_documents must skip. Returns the landing folder."""
    folder = home / "raw" / partition
    folder.mkdir(parents=True, exist_ok=True)
    first_file = None
    for case in cases:
        for name, data in case.files.items():
            (folder / name).write_bytes(data)
            first_file = first_file or name
    if extras:
        odd = odd_name_case()
        with open(os.path.join(os.fsencode(folder), odd.name), "wb") as handle:
            handle.write(odd.data)
        (folder / ".hidden_case.jsonl").write_bytes(dumps({"id": "hidden-1", "text": text_of("hidden", 1)}) + b"\n")
        (folder / "notes_case.txt").write_bytes(b"not a data file\n")
        if first_file is not None:
            (folder / "link_case.jsonl").symlink_to(first_file)
        (folder / "dir_case.jsonl").mkdir()
        (folder / "dir_case.jsonl" / "inner.jsonl").write_bytes(
            dumps({"id": "inner-1", "text": text_of("inner", 1)}) + b"\n"
        )
        os.mkfifo(folder / "fifo_case.jsonl")
    return folder
