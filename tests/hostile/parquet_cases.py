"""Parquet cases: values Python cannot hold, binary and nested columns, invalid UTF-8 cells,
damaged pages and missing footers, repeated columns, wrong types, nulls, zero rows, and the
string and time types a writer may choose.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tests.hostile.builders import Case, invalid_strings, parquet_bytes, text_of
from tests.hostile.spec import (
    AMBIGUOUS_ENCODING,
    AS_GB18030,
    DUPLICATE_FIELD,
    MISSING_FIELD,
    UNDECODABLE,
    UNREADABLE,
    WRONG_TYPE,
)


def parquet_cases() -> list[Case]:
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
