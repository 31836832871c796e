"""Hostile landed files, each with the exact outcome the reader spec promises for it.

`hostile_cases()` builds every case in memory (cached; about a second), `land_cases()` writes
them into a partition's landing folder. Each case is a few files named after its `kind`, and
every id and every text in it carries the kind, so all cases can share one partition: no id or
text of one case collides with another's (duplicate_id and duplicate_text are per partition).

Expectations are written from the reader spec (issue 6) and the limits of configs/tiny.yaml
(MIN_CHARS .. MAX_RECORD_BYTES in spec.py), never from what the code happens to do. Where the spec
leaves a choice open, the case's `note` says which expectation was chosen.

Nothing here imports aieng_core: the generator is an independent account of the data.

The cases live in one module per family (encoding_cases.py, text_cases.py, json_cases.py,
csv_cases.py, gzip_cases.py, parquet_cases.py), written against spec.py (the limits, the
reasons, the decoding rule) with builders.py (Case, Lines, gzip and Parquet bytes). This module
assembles and lands them, and re-exports the names the tests use.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from tests.hostile.builders import Case, OddNameCase, dumps, gz, parquet_bytes, text_of
from tests.hostile.csv_cases import csv_cases
from tests.hostile.encoding_cases import encoding_cases, wide_cases
from tests.hostile.gzip_cases import gzip_cases
from tests.hostile.json_cases import json_cases
from tests.hostile.parquet_cases import parquet_cases, row_group_unreadable
from tests.hostile.spec import (
    AMBIGUOUS_ENCODING,
    AS_GB18030,
    AS_UTF8,
    MALFORMED_JSON,
    MALFORMED_ROW,
    MAX_CHARS,
    MAX_FILE_BYTES,
    MAX_ID_CHARS,
    MAX_RECORD_BYTES,
    MIN_CHARS,
    MISSING_FIELD,
    REASONS,
    RECORD_TOO_LARGE,
    UNDECODABLE,
    UNREADABLE,
    spec_verdict,
)
from tests.hostile.text_cases import text_cases

__all__ = [
    "AMBIGUOUS_ENCODING",
    "AS_GB18030",
    "AS_UTF8",
    "Case",
    "IGNORED_ENTRIES",
    "MALFORMED_JSON",
    "MALFORMED_ROW",
    "MAX_CHARS",
    "MAX_FILE_BYTES",
    "MAX_ID_CHARS",
    "MAX_RECORD_BYTES",
    "MIN_CHARS",
    "MISSING_FIELD",
    "REASONS",
    "RECORD_TOO_LARGE",
    "UNDECODABLE",
    "UNREADABLE",
    "dumps",
    "gz",
    "hostile_cases",
    "land_cases",
    "odd_name_case",
    "parquet_bytes",
    "row_group_unreadable",
    "spec_verdict",
    "text_of",
]


def _empty_cases() -> list[Case]:
    return [
        Case("empty_jsonl", {"empty_jsonl.jsonl": b""}, {}, {}, 0, (), {}),
        Case("empty_csv", {"empty_csv.csv": b""}, {}, {}, 0, (), {}),
        Case("empty_jsonl_gz", {"empty_jsonl_gz.jsonl.gz": gz(b"")}, {}, {}, 0, (), {}),
        Case("empty_csv_gz", {"empty_csv_gz.csv.gz": gz(b"")}, {}, {}, 0, (), {}),
    ]


@lru_cache(maxsize=1)
def hostile_cases() -> list[Case]:
    """Every case; built once per process (treat the result as read-only)."""
    cases = [
        *encoding_cases(),
        *wide_cases(),
        *text_cases(),
        *json_cases(),
        *csv_cases(),
        *_empty_cases(),
        *gzip_cases(),
        *parquet_cases(),
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
