"""The Parquet reader: one record per row, read row group by row group, contract columns only.

A damaged page costs the rest of its row group, not the file; text and binary cells are
measured by Arrow before any conversion to Python, so an oversized row is rejected before it
is decoded.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from aieng_core.data import reasons
from aieng_core.data.decoding import Decoded, decode_unit
from aieng_core.data.lines import KEEP_BYTES
from aieng_core.data.raw_record import CONTRACT_FIELDS, RawRecord, ReadLimits


class Unconvertible:
    """A cell that cannot become a Python value (a timestamp out of range, an unknown time
    zone); the contract rejects it as wrong_type if it is in a contract field."""

    def __init__(self, problem: str) -> None:
        self.problem = problem

    def __repr__(self) -> str:
        return f"<unconvertible: {self.problem}>"


def _column_values(column: pa.Array, limits: ReadLimits) -> tuple[list[Any], list[Decoded | None]]:
    """Python values of one column, and per cell the failed decode of a text cell (or None).
    A cell that failed keeps its bytes as its value, for the quarantine's raw column."""
    kind = column.type
    if pa.types.is_dictionary(kind):
        column, kind = column.dictionary_decode(), kind.value_type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        try:
            column.validate(full=True)  # valid UTF-8 throughout: the fast path
            return column.to_pylist(), [None] * len(column)
        except pa.ArrowInvalid:
            # Writers that skip validation leave invalid UTF-8 in string columns; read the
            # bytes and decode each cell, so one bad cell costs one row.
            column = (
                column.cast(pa.binary_view())
                if pa.types.is_string_view(kind)
                else column.view(pa.large_binary() if pa.types.is_large_string(kind) else pa.binary())
            )
            kind = column.type
    if (
        pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_binary_view(kind)
        or pa.types.is_fixed_size_binary(kind)
    ):
        values: list[Any] = []
        failures: list[Decoded | None] = []
        for cell in column.to_pylist():
            decoded = None if cell is None else decode_unit(cell, limits.fallback_encodings)
            failed = decoded is not None and decoded.text is None
            values.append(cell if failed else (decoded.text if decoded else None))
            failures.append(decoded if failed else None)
        return values, failures
    try:
        values = column.to_pylist()
    except Exception:  # out-of-range dates, unknown time zones: convert cell by cell
        values = []
        for index in range(len(column)):
            try:
                values.append(column[index].as_py())
            except Exception as exc:
                values.append(Unconvertible(f"{kind}: {exc}"))
    temporal = (dt.datetime, dt.date, dt.time)
    return [value.isoformat() if isinstance(value, temporal) else value for value in values], [None] * len(column)


def _raw_json(row: dict[str, Any]) -> bytes:
    def default(value: Any) -> str:
        return value.decode("latin-1") if isinstance(value, bytes) else str(value)

    return json.dumps(row, ensure_ascii=False, default=default, sort_keys=True).encode("utf-8", "surrogatepass")[
        :KEEP_BYTES
    ]


def _cell_bytes(column: pa.Array) -> list[int]:
    """Bytes of each text or binary cell (0 for null and other types), computed by Arrow
    without building Python strings; a dictionary column is measured through its indices."""
    kind = column.type
    if pa.types.is_dictionary(kind):
        lengths = _cell_bytes(column.dictionary)
        return [0 if index is None else lengths[index] for index in column.indices.to_pylist()]
    if pa.types.is_fixed_size_binary(kind):
        return [kind.byte_width if valid else 0 for valid in column.is_valid().to_pylist()]
    if pa.types.is_string_view(kind):
        column = column.cast(pa.large_string())
    elif pa.types.is_binary_view(kind):
        column = column.cast(pa.large_binary())
    if (
        pa.types.is_string(column.type)
        or pa.types.is_large_string(column.type)
        or pa.types.is_binary(column.type)
        or pa.types.is_large_binary(column.type)
    ):
        return [length or 0 for length in pc.binary_length(column).to_pylist()]
    return [0] * len(column)


def _row_bytes(batch: pa.RecordBatch) -> list[int]:
    """Bytes of text and binary cells per row: the size a line-based record would have."""
    total = [0] * batch.num_rows
    for column in batch.columns:
        total = [t + n for t, n in zip(total, _cell_bytes(column))]
    return total


def _parquet_records(batch: pa.RecordBatch, name: str, first_row: int, limits: ReadLimits) -> Iterator[RawRecord]:
    """The records of one Arrow batch, converted to Python a slice of at most
    `data.batch_bytes` at a time: a dictionary column holding one 128 KiB value 4,096 times
    is 10 KB on disk but 512 MiB as Python strings."""
    sizes = _row_bytes(batch)
    start = 0
    while start < batch.num_rows:
        end, held = start + 1, sizes[start]
        while end < batch.num_rows and held + sizes[end] <= limits.batch_bytes:
            held += sizes[end]
            end += 1
        yield from _parquet_batch(batch.slice(start, end - start), sizes[start:end], name, first_row + start, limits)
        start = end


def _parquet_batch(
    batch: pa.RecordBatch, sizes: list[int], name: str, first_row: int, limits: ReadLimits
) -> list[RawRecord]:
    if max(sizes, default=0) > limits.max_record_bytes:
        # Oversized rows are rejected before any decoding or conversion to Python strings.
        fits = [size <= limits.max_record_bytes for size in sizes]
        kept_sizes = [size for size in sizes if size <= limits.max_record_bytes]
        read = iter(
            _parquet_batch(batch.filter(pa.array(fits)), kept_sizes, name, first_row, limits) if any(fits) else []
        )
        records = []
        for offset, size in enumerate(sizes):
            if fits[offset]:
                records.append(next(read)._replace(line=first_row + offset))
            else:
                detail = f"row holds {size} bytes of text, over data.max_record_bytes ({limits.max_record_bytes})"
                records.append(RawRecord(name, first_row + offset, b"", None, reasons.RECORD_TOO_LARGE, detail))
        return records
    columns = {field: _column_values(batch.column(index), limits) for index, field in enumerate(batch.schema.names)}
    records = []
    for offset in range(batch.num_rows):
        fields = {field: values[offset] for field, (values, _) in columns.items()}
        raw = _raw_json(fields)
        failed = next(
            ((field, failure) for field, (_, failures) in columns.items() if (failure := failures[offset]) is not None),
            None,
        )
        if failed is None:
            records.append(RawRecord(name, first_row + offset, raw, fields))
        else:
            field, decoded = failed
            records.append(RawRecord(name, first_row + offset, raw, None, decoded.reason, f"{field}: {decoded.detail}"))
    return records


def _batch_rows(parquet: pq.ParquetFile, group: int, columns: list[str], limits: ReadLimits) -> int:
    """Rows per Arrow batch for a row group: data.batch_rows, fewer when the footer says the
    group's contract columns average so many bytes a row that a batch would pass batch_bytes."""
    metadata = parquet.metadata.row_group(group)
    if not metadata.num_rows:
        return limits.batch_rows
    leaves = [i for i in range(metadata.num_columns) if parquet.schema.column(i).path.split(".")[0] in columns]
    size = sum(metadata.column(i).total_uncompressed_size for i in leaves)
    per_row = max(1, size // metadata.num_rows)
    return max(1, min(limits.batch_rows, limits.batch_bytes // per_row))


def read_parquet(path: Path, name: str, limits: ReadLimits = ReadLimits()) -> Iterator[RawRecord]:
    """One record per row, read row group by row group, contract columns only."""
    try:
        # Page checksums, where the writer wrote them, turn silent page corruption into an error;
        # dictionary columns stay dictionaries, so a repeated value is held once.
        schema = pq.ParquetFile(path).schema_arrow
        text_columns = [f for f in CONTRACT_FIELDS if f in schema.names and schema.names.count(f) == 1]
        parquet = pq.ParquetFile(path, page_checksum_verification=True, read_dictionary=text_columns)
    except Exception as exc:
        yield RawRecord(name, 0, b"", None, reasons.UNREADABLE, f"not a readable Parquet file (no valid footer): {exc}")
        return
    names = schema.names
    repeated = sorted({field for field in CONTRACT_FIELDS if names.count(field) > 1})
    columns = [field for field in CONTRACT_FIELDS if field in names]
    row = 0
    for group in range(parquet.num_row_groups):
        group_rows = parquet.metadata.row_group(group).num_rows
        done = 0
        if repeated:
            detail = f"column {', '.join(map(repr, repeated))} appears more than once in the schema"
            for offset in range(group_rows):
                yield RawRecord(name, row + offset + 1, b"", None, reasons.DUPLICATE_FIELD, detail)
            row += group_rows
            continue
        if not columns:
            for offset in range(group_rows):
                yield RawRecord(name, row + offset + 1, b"{}", {})
            row += group_rows
            continue
        batches = parquet.iter_batches(
            batch_size=_batch_rows(parquet, group, columns, limits),
            row_groups=[group],
            columns=columns,
            use_threads=False,
        )
        while True:
            try:
                batch = next(batches, None)
            except Exception as exc:  # a damaged page: the rest of this row group is lost, the next one is read
                lost = (
                    f"row group {group} (rows {row + 1}-{row + group_rows}) unreadable from row {row + done + 1}: {exc}"
                )
                for offset in range(done, group_rows):
                    yield RawRecord(name, row + offset + 1, b"", None, reasons.UNREADABLE, lost)
                break
            if batch is None:
                break
            yield from _parquet_records(batch, name, row + done + 1, limits)
            done += batch.num_rows
        row += group_rows
    declared = parquet.metadata.num_rows
    if declared > row:
        # The footer's total promises rows that no row group holds: account for each.
        detail = f"the footer declares {declared} rows but its row groups hold {row}"
        for offset in range(row, declared):
            yield RawRecord(name, offset + 1, b"", None, reasons.UNREADABLE, detail)
