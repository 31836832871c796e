"""Landed bytes: gzip members, damage, bombs and limits; lines and their independent count."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from aieng_core.data.byte_source import ByteSource, Gap, SuspectBytes
from aieng_core.data.lines import Layout, Line, LineGap, is_blank, split_lines
from aieng_core.data.record_count import count_lines


def lines_of(count: int, tag: str) -> bytes:
    return b"".join(
        json.dumps({"id": f"{tag}{i}", "text": f"member {tag} line {i}"}).encode() + b"\n" for i in range(count)
    )


def pieces(tmp_path: Path, name: str, data: bytes, limit: int = 1 << 30) -> list[bytes | Gap]:
    path = tmp_path / name
    path.write_bytes(data)
    return list(ByteSource(path, limit).pieces())


def joined(items: list[bytes | Gap]) -> bytes:
    return b"".join(p for p in items if isinstance(p, bytes))


def test_plain_file_is_read_whole(tmp_path: Path) -> None:
    assert joined(pieces(tmp_path, "a.jsonl", b"abc\n" * 1000)) == b"abc\n" * 1000


def test_plain_file_over_max_file_bytes_ends_in_a_gap(tmp_path: Path) -> None:
    items = pieces(tmp_path, "a.jsonl", b"x" * 5000, limit=2048)
    assert joined(items) == b"x" * 2048
    assert items[-1] == Gap(2048, 5000, items[-1].detail) and "max_file_bytes" in items[-1].detail


def test_multi_member_gzip_reads_every_member(tmp_path: Path) -> None:
    data = b"".join(gzip.compress(lines_of(50, f"m{k}-"), mtime=0) for k in range(4))
    assert joined(pieces(tmp_path, "a.jsonl.gz", data)) == b"".join(lines_of(50, f"m{k}-") for k in range(4))


def test_damaged_member_costs_only_itself(tmp_path: Path) -> None:
    members = [gzip.compress(lines_of(50, f"m{k}-"), mtime=0) for k in range(4)]
    broken = bytearray(members[1])
    broken[12:40] = b"\x00" * 28  # deflate data destroyed: a decode error, not only a CRC one
    data = members[0] + bytes(broken) + members[2] + members[3]
    items = pieces(tmp_path, "a.jsonl.gz", data)
    gaps = [p for p in items if isinstance(p, Gap)]
    assert len(gaps) == 1
    assert (gaps[0].start, gaps[0].end) == (len(members[0]), len(members[0]) + len(broken))
    text = joined(items)
    assert text.startswith(lines_of(50, "m0-")) and text.endswith(lines_of(50, "m2-") + lines_of(50, "m3-"))


def test_checksum_failure_keeps_bytes_but_marks_them_suspect(tmp_path: Path) -> None:
    member = bytearray(gzip.compress(lines_of(20, "c"), mtime=0))
    member[-8] ^= 0x01  # the stored CRC-32 no longer matches
    items = pieces(tmp_path, "a.jsonl.gz", bytes(member))
    assert all(isinstance(p, SuspectBytes) for p in items) and joined(items) == lines_of(20, "c")
    assert "CRC" in items[0].detail


def test_truncated_gzip_keeps_what_came_before(tmp_path: Path) -> None:
    whole = gzip.compress(lines_of(400, "t"), mtime=0)
    items = pieces(tmp_path, "a.jsonl.gz", whole[: len(whole) // 2])
    assert isinstance(items[-1], Gap) and "truncated" in items[-1].detail
    assert lines_of(400, "t").startswith(joined(items)) and len(joined(items)) > 1000


def test_trailing_zeros_are_padding_and_junk_is_a_gap(tmp_path: Path) -> None:
    member = gzip.compress(lines_of(3, "z"), mtime=0)
    assert pieces(tmp_path, "a.jsonl.gz", member + b"\0" * 512) == [lines_of(3, "z")]
    items = pieces(tmp_path, "b.jsonl.gz", member + b"junk that is not gzip" + member)
    assert [type(p) for p in items] == [bytes, Gap, bytes]


def test_a_bomb_is_decompressed_in_bounded_pieces(tmp_path: Path) -> None:
    bomb = gzip.compress(b"a" * (64 << 20), mtime=0)
    sizes = [len(p) for p in pieces(tmp_path, "bomb.jsonl.gz", bomb, limit=8 << 20)[:-1]]
    assert max(sizes) <= 1 << 20 and sum(sizes) == 8 << 20


def test_long_lines_are_never_held_whole() -> None:
    items = list(split_lines([b"a" * 3000, b"b" * 3000 + b"\nshort\n"], Layout(), max_bytes=5000))
    assert items[0] == Line(1, (b"a" * 3000 + b"b" * 3000)[:4096], 6000, True)
    assert items[1] == Line(2, b"short", 5, False)


def test_wide_lines_split_only_on_aligned_newlines() -> None:
    text = "\u0a0a中\nb\n"  # U+0A0A holds 0x0A bytes that are not a newline code unit
    data = b"\xff\xfe" + text.encode("utf-16-le")
    items = list(split_lines([data[:5], data[5:]], Layout(2, "little", 2), 1000))
    assert [item.data.decode("utf-16-le") for item in items] == ["\u0a0a中", "b"]


PIECE = st.one_of(
    st.binary(max_size=24).map(lambda b: b.replace(b"\x01", b"\n")),
    st.sampled_from([b"\n", b" \n", b"\r\n", b'"', b"\t\n\n"]),
    st.just(Gap(0, 1, "gap")),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(PIECE, max_size=8), st.integers(1, 40))
def test_independent_count_agrees_with_the_splitter(items: list, max_bytes: int) -> None:
    """The vectorised count (record_count.py) and the line splitter the readers use are two
    implementations of one definition; a disagreement is a reader losing or inventing rows."""
    count = count_lines(items, Layout(), max_bytes)
    split = list(split_lines(items, Layout(), max_bytes))
    lines = [item for item in split if isinstance(item, Line)]
    assert count.lines == len(lines)
    assert count.records == sum(1 for line in lines if line.too_large or not is_blank(line.data))
    assert count.gaps == sum(1 for item in split if isinstance(item, LineGap))


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="a \n\r中😀", max_size=30),
    st.integers(0, 6),
    st.booleans(),
    st.sampled_from(["utf-16-le", "utf-16-be", "utf-32-le"]),
)
def test_independent_count_agrees_on_wide_encodings(text: str, cut: int, odd: bool, codec: str) -> None:
    width = 4 if "32" in codec else 2
    data = text.encode(codec) + (b"\x00" if odd else b"")
    layout = Layout(width, "little" if codec.endswith("le") else "big", 0)
    chunks = [data[:cut], data[cut:]]
    count = count_lines(chunks, layout, 1000)
    lines = list(split_lines(chunks, layout, 1000))
    assert count.lines == len(lines)
    assert count.records == sum(1 for line in lines if not is_blank(line.data, layout))


def test_fake_member_headers_cost_linear_time(tmp_path: Path) -> None:
    """Junk full of gzip magic: every candidate is tried once, from one read of its window
    (re-reading a 1 MiB window per candidate made 400 KB take 19 s)."""
    for unit in (b"\x1f\x8b\x08\xe0", b"\x1f\x8b\x08\x08" + b"\x01" * 6, b"\x1f\x8b\x08\x00" + b"\x00" * 6):
        items = pieces(tmp_path, "junk.jsonl.gz", unit * (400_000 // len(unit)))
        assert len(items) == 1 and isinstance(items[0], Gap)


def test_resync_verification_spends_at_most_max_file_bytes(tmp_path: Path) -> None:
    """A fake header in front of a bomb: verifying the candidate stops at the file's limit."""
    bomb = gzip.compress(b"a" * (256 << 20), mtime=0)
    items = pieces(tmp_path, "a.jsonl.gz", b"X" + bomb, limit=1 << 20)
    assert [type(p) for p in items] == [Gap]
