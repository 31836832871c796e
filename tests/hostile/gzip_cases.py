"""Gzip cases: truncated, damaged and split members, padding and trailing garbage, a file that
is not gzip, a decompression bomb, the file-size limit, very wide rows, and mixed encodings
in a gzipped CSV.
"""

from __future__ import annotations

import zlib
from itertools import islice, product

from tests.hostile.builders import Case, Lines, case_of, dumps, gz, gz_repeated, text_of
from tests.hostile.spec import AS_GB18030, RECORD_TOO_LARGE, UNDECODABLE, UNREADABLE


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


def gzip_cases() -> list[Case]:
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
