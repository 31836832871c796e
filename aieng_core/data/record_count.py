"""How many records a landed file holds, counted without the parsers that read them.

The blocking `rows_accounted_for` check compares this count with the rows written to
clean.parquet and quarantine.parquet, so a reader that loses rows fails it. The count must
therefore not share the readers' logic: line files are counted here with vectorised scans
over the raw code units, Parquet files from their footers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq

from aieng_core.data.byte_source import Gap
from aieng_core.data.lines import Layout

_NOT_VISIBLE = np.array([0x20, 0x09, 0x0D, 0x0B, 0x0C, 0x0A], dtype=np.uint32)  # ASCII whitespace and newline


@dataclass
class LineCount:
    lines: int = 0  # physical lines, blank ones included
    records: int = 0  # lines holding a non-whitespace byte, or over the size limit
    gaps: int = 0  # unreadable ranges (each is one quarantined record)
    has_quote: bool = False  # any '"' code unit: CSV records may then span lines


def count_lines(pieces: Iterable[bytes | Gap], layout: Layout, max_bytes: int) -> LineCount:
    width = layout.width
    dtype = np.dtype(np.uint8) if width == 1 else np.dtype(f"{'<' if layout.byteorder == 'little' else '>'}u{width}")
    count = LineCount()
    size, visible = 0, False  # the line in progress
    carry = b""
    to_skip = layout.skip

    def finish(line_size: int, line_visible: bool) -> None:
        count.lines += 1
        if line_visible or line_size > max_bytes:
            count.records += 1

    for piece in pieces:
        if isinstance(piece, Gap):
            count.gaps += 1
            size, visible, carry = 0, False, b""  # the cut-off line belongs to the gap
            continue
        if to_skip:
            dropped = len(piece[:to_skip])
            piece, to_skip = piece[to_skip:], to_skip - dropped
        piece = carry + piece
        cut = len(piece) - len(piece) % width
        piece, carry = piece[:cut], piece[cut:]
        units = np.frombuffer(piece, dtype=dtype)
        if not count.has_quote and (units == 0x22).any():
            count.has_quote = True
        newlines = np.flatnonzero(units == 0x0A)
        shown = np.concatenate([[0], np.cumsum(~np.isin(units, _NOT_VISIBLE))])
        starts = np.concatenate([[0], newlines + 1])
        ends = np.concatenate([newlines, [len(units)]])
        line_visible = (shown[ends] - shown[starts]) > 0
        line_size = (ends - starts) * width
        if not len(newlines):
            size, visible = size + int(line_size[0]), visible or bool(line_visible[0])
            continue
        finish(size + int(line_size[0]), visible or bool(line_visible[0]))
        middle = slice(1, len(newlines))  # lines that begin and end inside this piece
        count.lines += len(newlines) - 1
        count.records += int(np.count_nonzero(line_visible[middle] | (line_size[middle] > max_bytes)))
        size, visible = int(line_size[-1]), bool(line_visible[-1])
    if carry:
        size, visible = size + len(carry), True  # a dangling partial code unit is not whitespace
    if size:
        finish(size, visible)
    return count


def parquet_footer_rows(path) -> int | None:
    """Rows the Parquet footer declares, or None when there is no readable footer."""
    try:
        return pq.ParquetFile(path).metadata.num_rows
    except Exception:  # any failure to read a footer means: no trustworthy count
        return None
