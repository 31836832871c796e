"""The Case record (a few landed files with the exact outcome the spec promises for them)
and the small builders every family of cases uses: texts that never collide, Lines (a line
file built record by record), and deterministic gzip and Parquet bytes.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


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
