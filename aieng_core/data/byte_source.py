"""The bytes of one landed file, decompressed and bounded, with unreadable ranges marked.

`ByteSource(path, limit).pieces()` yields the file's (decompressed) bytes in chunks, and a
`Gap` wherever bytes cannot be read: a damaged or truncated gzip member, junk between
members, or everything past `limit` decompressed bytes. Readers turn each Gap into one
quarantined record naming the byte range, and carry on after it.

Gzip files are read member by member (concatenated gzip, as bgzip and `cat a.gz b.gz`
write them). A first pass decodes every member and checks its CRC, so a member whose data
fails its checksum is never read as clean text: each of its lines is quarantined on its own
(SuspectBytes); data before a member's decode error or truncation point is kept. After
damage, reading resumes at the next position that holds a whole, CRC-verified gzip member.
Zero bytes after a member are ignored, as GNU gzip does; a file of zero bytes alone is junk
(GNU gzip: "not in gzip format"), one unreadable range.
Output is produced in bounded chunks (`max_length`), so a small bomb never expands in memory.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

IN_CHUNK = 1 << 20
OUT_CHUNK = 1 << 20
GZIP_MAGIC = b"\x1f\x8b\x08"
_CHECKSUM_ERRORS = ("incorrect data check", "incorrect length check")
MAX_HEADER_FIELD = 4096  # longest FNAME/FCOMMENT accepted in a gzip header (PATH_MAX)
DEFLATE_IN_CHUNK = 16 << 10  # small, so a decode error loses little of the output before it


class SuspectBytes(bytes):
    """Decompressed bytes of a gzip member that fails its CRC check: some byte in it is
    wrong, nobody can say which, so every line they touch is quarantined on its own."""

    detail: str = ""


def suspect(data: bytes, detail: str) -> SuspectBytes:
    piece = SuspectBytes(data)
    piece.detail = detail
    return piece


class Gap(NamedTuple):
    """A byte range of the landed file that could not be read."""

    start: int  # offset in the file as landed (compressed bytes for gzip)
    end: int
    detail: str


@dataclass(frozen=True)
class _Segment:
    start: int  # compressed byte range
    end: int
    keep: int  # decompressed bytes of the segment that are read as data
    problem: str | None  # why the rest of the segment is a Gap; None when whole
    suspect: str | None = None  # set when the kept bytes fail the member's CRC check


def is_gzip_name(name: str) -> bool:
    return name.endswith(".gz")


class ByteSource:
    def __init__(self, path: Path, limit: int, gzip: bool | None = None) -> None:
        self.path = Path(path)
        self.limit = limit  # most decompressed bytes read from the file (data.max_file_bytes)
        self.gzip = is_gzip_name(self.path.name) if gzip is None else gzip

    def pieces(self) -> Iterator[bytes | Gap]:
        if not self.gzip:
            yield from self._plain_pieces()
            return
        with open(self.path, "rb") as handle:
            for segment in self._segments:
                if segment.keep:
                    for piece in _member_output(handle, segment.start, segment.keep):
                        if isinstance(piece, bytes):
                            yield suspect(piece, segment.suspect) if segment.suspect else piece
                if segment.problem is not None:
                    yield Gap(segment.start, segment.end, segment.problem)

    def _plain_pieces(self) -> Iterator[bytes | Gap]:
        size = self.path.stat().st_size
        read = 0
        with open(self.path, "rb") as handle:
            while chunk := handle.read(min(IN_CHUNK, self.limit - read)):
                read += len(chunk)
                yield chunk
        if size > read:
            yield Gap(read, size, f"bytes {read}-{size} not read: the file is over data.max_file_bytes ({self.limit})")

    @cached_property
    def _segments(self) -> list[_Segment]:
        """Walk the members once, decoding each to find where it ends and whether it is whole."""
        size = self.path.stat().st_size
        segments: list[_Segment] = []
        total = 0
        position = 0
        budget = [self.limit]  # what verifying resync candidates may decompress, in all
        with open(self.path, "rb") as handle:
            while position < size:
                if not _has_member_header(handle, position):
                    # Zero bytes after a member are padding; a file of zero bytes alone (what a
                    # crash can leave of a preallocated file) holds no member: it is junk.
                    if segments and _only_zeros(handle, position, size):
                        break  # padding after the last member
                    resume = _next_member(handle, position + 1, size, budget)
                    end = size if resume is None else resume
                    segments.append(_Segment(position, end, 0, f"compressed bytes {position}-{end} are not gzip data"))
                    if resume is None:
                        break
                    position = resume
                    continue
                member_end, produced, error = _scan_member(handle, position, self.limit - total)
                if error is None:
                    segments.append(_Segment(position, member_end, produced, None))
                    total += produced
                    position = member_end
                    continue
                if error == "limit":
                    segments.append(
                        _Segment(
                            position,
                            size,
                            produced,
                            f"compressed bytes {position}-{size} not read: over data.max_file_bytes "
                            f"({self.limit}) decompressed",
                        )
                    )
                    break
                total += produced
                if error.startswith(_CHECKSUM_ERRORS):
                    # Decoded to its end, but some byte is wrong: keep every line, each quarantined.
                    why = (
                        f"gzip member at compressed bytes {position}-{member_end} fails its CRC check ({error}): "
                        "this line may be corrupt"
                    )
                    segments.append(_Segment(position, member_end, produced, None, why))
                    position = member_end  # whatever follows is read (or marked) like any other member
                    continue
                resume = _next_member(handle, position + 1, size, budget)
                end = size if resume is None else resume
                # Deflate output before the point of damage comes from undamaged input: kept.
                why = (
                    f"gzip member at compressed bytes {position}-{end} is damaged after {produced} "
                    f"decompressed bytes: {error}"
                )
                segments.append(_Segment(position, end, produced, why))
                if resume is None:
                    break
                position = resume
        return segments


def _deflate_start(handle, start: int) -> int | None:
    """Where the deflate data of a gzip member at `start` begins (RFC 1952), or None when
    there is no valid member header there."""
    handle.seek(start)
    header = handle.read(10)
    # Magic, deflate, and no reserved flag bits: what every gzip writer emits.
    if len(header) < 10 or not header.startswith(GZIP_MAGIC) or header[3] & 0xE0:
        return None
    flags, position = header[3], start + 10
    if flags & 0x04:  # FEXTRA: a length-prefixed field
        length = handle.read(2)
        if len(length) < 2:
            return None
        position += 2 + int.from_bytes(length, "little")
    for flag in (0x08, 0x10):  # FNAME, FCOMMENT: zero-terminated strings
        if flags & flag:
            handle.seek(position)
            field = handle.read(MAX_HEADER_FIELD)
            end = field.find(b"\0")
            if end < 0:
                return None  # no writer stores a file name or comment this long: not a header
            position += end + 1
    if flags & 0x02:  # FHCRC
        position += 2
    return position


def _member_output(handle, start: int, limit: int) -> Iterator[bytes | str]:
    """Decompressed pieces of the member at `start`, up to `limit` bytes. Ends by yielding a
    str: "" when the member ended cleanly, else what went wrong ("limit" when cut off).

    The header and the CRC-32/size trailer are handled here rather than by zlib, because
    zlib discards the output of the call that fails: a checksum error would otherwise take
    the whole member's data with it. Input goes in small chunks for the same reason."""
    position = _deflate_start(handle, start)
    if position is None:
        yield "not a gzip member header"
        return
    handle.seek(position)
    decompressor = zlib.decompressobj(-15)  # raw deflate
    produced, crc = 0, 0
    while not decompressor.eof:
        chunk = handle.read(DEFLATE_IN_CHUNK)
        if not chunk:
            yield "the gzip stream is truncated"
            return
        data = chunk
        while data and not decompressor.eof:
            try:
                piece = decompressor.decompress(data, min(OUT_CHUNK, limit - produced + 1))
            except zlib.error as exc:
                yield str(exc)
                return
            if produced + len(piece) > limit:
                yield piece[: limit - produced]
                yield "limit"
                return
            produced += len(piece)
            crc = zlib.crc32(piece, crc)
            if piece:
                yield piece
            data = decompressor.unconsumed_tail
    trailer = decompressor.unused_data
    handle.seek(-len(trailer), 1)
    trailer = handle.read(8)
    if len(trailer) < 8:
        yield "the gzip stream is truncated (no CRC-32 trailer)"
        return
    if int.from_bytes(trailer[:4], "little") != crc:
        yield "incorrect data check (CRC-32 mismatch)"
        return
    if int.from_bytes(trailer[4:], "little") != produced & 0xFFFFFFFF:
        yield "incorrect length check"
        return
    yield ""


def _scan_member(handle, start: int, limit: int) -> tuple[int, int, str | None]:
    """(end offset, decompressed bytes, error or None) of the member at `start`; the end
    offset is exact when the member decoded to its trailer (no error, or a checksum error)."""
    produced = 0
    for piece in _member_output(handle, start, limit):
        if isinstance(piece, str):
            return handle.tell(), produced, piece or None
        produced += len(piece)
    raise AssertionError("unreachable: _member_output always ends with a status")


def _has_member_header(handle, position: int) -> bool:
    return _deflate_start(handle, position) is not None


def _only_zeros(handle, position: int, size: int) -> bool:
    handle.seek(position)
    while chunk := handle.read(IN_CHUNK):
        if chunk.count(0) != len(chunk):
            return False
    return True


def _next_member(handle, position: int, size: int, budget: list[int]) -> int | None:
    """The next offset at or after `position` where a whole, CRC-verified member starts.

    `budget` ([bytes]) is what verifying candidates may still decompress, shared by all the
    resyncs of one file, so junk full of fake headers costs bounded time."""
    while position < size:
        handle.seek(position)
        window = handle.read(IN_CHUNK + len(GZIP_MAGIC))
        found = window.find(GZIP_MAGIC)
        while 0 <= found < IN_CHUNK:
            candidate = position + found
            # A candidate inside compressed data almost never decodes to its end with a valid
            # CRC; checking the whole member keeps junk that holds the magic bytes out.
            if _has_member_header(handle, candidate):
                if budget[0] <= 0:
                    return None
                end, produced, error = _scan_member(handle, candidate, budget[0])
                budget[0] -= max(produced, end - candidate)
                if error is None:
                    return candidate
            found = window.find(GZIP_MAGIC, found + 1)
        position += IN_CHUNK
    return None
