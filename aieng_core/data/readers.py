"""Reading landed files into raw records, one record per input row, streaming.

Every record that goes in comes out as exactly one RawRecord: either with its parsed
contract fields, or with the quarantine reason that stopped it. A reader error costs only
the records it cannot read: a bad line, cell, page or gzip member is quarantined with its
line, row or byte range, and reading goes on after it. `LandedFile.tally()` compares the
records read with a count taken without the parsers (record_count.py), which is what makes
`rows_in == rows_clean + rows_quarantined` mean something.

Every bound is applied before the expensive work: a line over `data.max_record_bytes` is
never held whole or parsed, decompression stops at `data.max_file_bytes`, and only the
contract's fields are kept from a parsed record, so memory is bounded by configuration
whatever the input.

Each format's reader is a module of its own (jsonl_reader.py, csv_reader.py,
parquet_reader.py, sharing raw_record.py); this one picks the reader by suffix and keeps the
tally.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aieng_core.data import reasons
from aieng_core.data.byte_source import ByteSource
from aieng_core.data.csv_reader import read_csv
from aieng_core.data.jsonl_reader import read_jsonl
from aieng_core.data.parquet_reader import read_parquet
from aieng_core.data.raw_record import RawRecord, ReadLimits, detect_layout
from aieng_core.data.record_count import count_lines, parquet_footer_rows

DATA_SUFFIXES = (".jsonl", ".jsonl.gz", ".csv", ".csv.gz", ".parquet")

log = logging.getLogger("aieng.data")


def is_data_file(name: str) -> bool:
    return not name.startswith(".") and name.endswith(DATA_SUFFIXES)


def read_records(path: Path, name: str, limits: ReadLimits = ReadLimits()) -> Iterator[RawRecord]:
    """All records of one landed file, by its suffix."""
    return LandedFile(path, name, limits).records()


class LandedFile:
    """One landed file: its records, and how many it should have produced."""

    def __init__(self, path: Path, name: str, limits: ReadLimits = ReadLimits()) -> None:
        if not name.endswith(DATA_SUFFIXES):
            raise ValueError(f"{name}: not a data file (expected one of {', '.join(DATA_SUFFIXES)})")
        self.path, self.name, self.limits = Path(path), name, limits
        self.source = ByteSource(self.path, limits.max_file_bytes)
        self.read = 0
        self.lines_consumed = 0  # CSV: physical lines the reader went through
        self.header_quarantined = False  # CSV: the header could not be used and is a record itself

    def records(self) -> Iterator[RawRecord]:
        if self.name.endswith(".parquet"):
            reader = read_parquet(self.path, self.name, self.limits)
        elif self.name.endswith((".jsonl", ".jsonl.gz")):
            reader = read_jsonl(self.source, self.name, self.limits)
        else:
            reader = read_csv(self.source, self.name, self.limits, self)
        line = 0
        try:
            for record in reader:
                self.read += 1
                line = record.line
                yield record
        except Exception as exc:  # a reader bug must cost this file's rest, visibly, not the partition
            log.error(f"{self.name}: reader failed after line {line}: {exc!r}")
            self.read += 1
            yield RawRecord(
                self.name, line + 1, b"", None, reasons.UNREADABLE, f"reader failed after line {line}: {exc!r}"
            )

    def tally(self) -> dict[str, Any]:
        """Records read and records expected from a count that shares no parser with the reader."""
        if self.name.endswith(".parquet"):
            rows = parquet_footer_rows(self.path)
            expected, source = (1, "no readable footer") if rows is None else (rows, "parquet footer")
        else:
            layout, _ = detect_layout(self.source)
            count = count_lines(self.source.pieces(), layout, self.limits.max_record_bytes)
            if self.name.endswith((".jsonl", ".jsonl.gz")):
                expected, source = count.records + count.gaps, "non-blank lines"
            elif not count.has_quote:
                header = 0 if self.header_quarantined else 1
                expected, source = max(count.records - header, 0) + count.gaps, "non-blank lines after the header"
            else:
                # Quoted fields may span lines: every physical line must have been consumed.
                expected, source = self.read + abs(count.lines - self.lines_consumed), "lines consumed"
        return {"expected": expected, "read": self.read, "count_source": source}
