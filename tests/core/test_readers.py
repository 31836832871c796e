"""Landed bytes to records: every encoding path, compression, Parquet, and line numbers."""

from __future__ import annotations

import codecs
import csv
import datetime as dt
import gzip
import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from aieng_core.config import DataConfig
from aieng_core.data.decoding import bom_encoding, decode_unit
from aieng_core.data.readers import is_data_file, read_records
from tests.core.helpers import clean_files, json_line, jsonl

CONFIG = DataConfig(min_chars=5, max_chars=10_000, batch_rows=3)

EN = "Grüße aus Köln, ein café crème."
ZH = "数据管道每天凌晨读取新落地的原始文本。"
ZH2 = "编码问题是老系统迁移时最常见的坑。"
ZH3 = "隔离区保存每一条被拒绝的记录和拒绝原因。"


def csv_bytes(
    rows: list[list[str]], encoding: str = "utf-8", header: tuple[str, ...] = ("id", "text", "lang")
) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue().encode(encoding)


def parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


# ---- byte-order marks -------------------------------------------------------------------
def test_utf8_bom_jsonl(tmp_path: Path) -> None:
    data = codecs.BOM_UTF8 + jsonl({"id": "a", "text": EN}, {"id": "b", "text": ZH})
    result = clean_files(tmp_path, {"bom.jsonl": data}, CONFIG)
    assert result.metrics["rows_in"] == 2 and result.reasons == {}
    assert result.texts() == {"a": EN, "b": ZH}  # the BOM is not part of the first id
    assert [(row["source_file"], row["line"]) for row in result.clean] == [("bom.jsonl", 1), ("bom.jsonl", 2)]


def test_utf8_bom_csv(tmp_path: Path) -> None:
    data = codecs.BOM_UTF8 + csv_bytes([["a", EN, "de"], ["b", ZH, "zh"]])
    result = clean_files(tmp_path, {"bom.csv": data}, CONFIG)
    assert result.reasons == {}
    assert result.texts() == {"a": EN, "b": ZH}  # the BOM is not part of the "id" column name
    assert [row["lang"] for row in result.clean] == ["de", "zh"]
    assert [row["line"] for row in result.clean] == [2, 3]


UTF16_VARIANTS = {
    "utf-16-le": lambda text: codecs.BOM_UTF16_LE + text.encode("utf-16-le"),
    "utf-16-be": lambda text: codecs.BOM_UTF16_BE + text.encode("utf-16-be"),
    "utf-32-le": lambda text: codecs.BOM_UTF32_LE + text.encode("utf-32-le"),
}


@pytest.mark.parametrize("variant", sorted(UTF16_VARIANTS))
def test_wide_encoding_jsonl_with_bom(tmp_path: Path, variant: str) -> None:
    text = jsonl({"id": "a", "text": EN}, {"id": "b", "text": ZH}).decode("utf-8") + "\n" + '{"id": "c", "text": "cut\n'
    result = clean_files(tmp_path, {"wide.jsonl": UTF16_VARIANTS[variant](text)}, CONFIG)
    assert result.metrics["rows_in"] == 3
    assert result.texts() == {"a": EN, "b": ZH}
    assert result.reasons == {"malformed_json": 1}
    (bad,) = result.quarantine
    assert bad["line"] == 4  # the blank line 3 is not a record but still counts
    assert bad["raw"] == b'{"id": "c", "text": "cut'  # kept, re-encoded as UTF-8


@pytest.mark.parametrize("variant", ["utf-16-le", "utf-16-be"])
def test_utf16_csv_with_bom(tmp_path: Path, variant: str) -> None:
    text = csv_bytes([["a", EN, "de"], ["b", ZH, "zh"]]).decode("utf-8") + "c,too,many,x\n"
    result = clean_files(tmp_path, {"wide.csv": UTF16_VARIANTS[variant](text)}, CONFIG)
    assert result.texts() == {"a": EN, "b": ZH}
    assert result.reasons == {"malformed_row": 1}
    assert result.quarantine[0]["line"] == 4
    assert result.quarantine[0]["raw"] == b"c,too,many,x"


# ---- GBK --------------------------------------------------------------------------------
def test_gbk_line_inside_utf8_jsonl_is_recovered(tmp_path: Path) -> None:
    data = (
        json_line({"id": "u1", "text": EN})
        + json_line({"id": "g1", "text": ZH, "lang": "zh"}, "gbk")
        + json_line({"id": "u2", "text": ZH2})
    )
    assert decode_unit(json_line({"id": "g1", "text": ZH}, "gbk")[:-1]).encoding == "gb18030"
    result = clean_files(tmp_path, {"mixed.jsonl": data}, CONFIG)
    assert result.reasons == {}
    assert result.texts() == {"u1": EN, "g1": ZH, "u2": ZH2}
    assert [row["lang"] for row in result.clean] == [None, "zh", None]
    assert [row["line"] for row in result.clean] == [1, 2, 3]


def test_gbk_encoded_csv_file_is_decoded(tmp_path: Path) -> None:
    data = csv_bytes([["g1", ZH, "zh"], ["g2", ZH2, "zh"], ["g3", ZH3, "zh"]], encoding="gbk")
    result = clean_files(tmp_path, {"legacy.csv": data}, CONFIG)
    assert result.reasons == {}
    assert result.texts() == {"g1": ZH, "g2": ZH2, "g3": ZH3}


def test_undecodable_jsonl_line_is_quarantined_with_its_bytes(tmp_path: Path) -> None:
    bad = b'{"id": "x", "text": "caf\xe9 \xff not UTF-8, not GB18030"}'
    data = json_line({"id": "a", "text": EN}) + bad + b"\n" + json_line({"id": "b", "text": ZH})
    result = clean_files(tmp_path, {"bad.jsonl": data}, CONFIG)
    assert result.metrics["rows_in"] == 3
    assert result.reasons == {"undecodable": 1}
    assert result.texts() == {"a": EN, "b": ZH}
    (row,) = result.quarantine
    assert (row["source_file"], row["line"], row["reason"], row["raw"]) == ("bad.jsonl", 2, "undecodable", bad)
    assert row["detail"]


def test_csv_rows_mixing_encodings_are_decoded_row_by_row(tmp_path: Path) -> None:
    utf8_row = f"u1,{ZH} x,zh\n".encode()
    gbk_row = f"g1,{ZH2},zh\n".encode("gbk")
    bad_row = b"b1,\xff\xfe broken bytes here,en\n"
    data = b"id,text,lang\n" + utf8_row + gbk_row + bad_row + f'u2,"{EN}",de\n'.encode()
    result = clean_files(tmp_path, {"mixed.csv": data}, CONFIG)
    assert result.metrics["rows_in"] == 4
    assert result.texts() == {"u1": f"{ZH} x", "g1": ZH2, "u2": EN}
    assert result.reasons == {"undecodable": 1}
    (row,) = result.quarantine
    assert (row["line"], row["raw"]) == (4, bad_row.rstrip(b"\n"))


def test_csv_mixing_utf8_and_gbk_rows_keeps_the_utf8_rows_intact(tmp_path: Path) -> None:
    """UTF-8 Chinese whose bytes happen to pair up as valid GB18030 must not become mojibake.

    "中文" in UTF-8 (e4 b8 ad e6 96 87) is also valid GB18030 ("涓枃"), so the whole file
    decodes as GB18030; picking that per-file encoding silently garbles every UTF-8 row.
    """
    data = b"id,text\n" + "u1,中文中文中文中文\n".encode() + f"g1,{ZH2}\n".encode("gbk")
    result = clean_files(tmp_path, {"mixed.csv": data}, CONFIG)
    assert result.texts() == {"u1": "中文中文中文中文", "g1": ZH2}


def test_utf8_bom_csv_with_a_gbk_row_keeps_its_header(tmp_path: Path) -> None:
    """A UTF-8-with-BOM CSV with one legacy GBK row: the row-by-row path must drop the BOM
    from the header too, or the "id" column is never found and every row is missing_field."""
    data = codecs.BOM_UTF8 + b"id,text\n" + f"u1,{ZH} x\n".encode() + f"g1,{ZH2}\n".encode("gbk")
    result = clean_files(tmp_path, {"bom-mixed.csv": data}, CONFIG)
    assert result.reasons == {}
    assert result.texts() == {"u1": f"{ZH} x", "g1": ZH2}


# ---- compression ------------------------------------------------------------------------
def test_gzipped_jsonl(tmp_path: Path) -> None:
    raw = json_line({"id": "a", "text": EN}) + json_line({"id": "g", "text": ZH}, "gbk") + b'{"broken\n'
    result = clean_files(tmp_path, {"day.jsonl.gz": gzip.compress(raw, mtime=0)}, CONFIG)
    assert result.texts() == {"a": EN, "g": ZH}
    assert result.reasons == {"malformed_json": 1}
    assert (result.quarantine[0]["line"], result.quarantine[0]["raw"]) == (3, b'{"broken')


def test_gzipped_utf8_bom_jsonl(tmp_path: Path) -> None:
    raw = codecs.BOM_UTF8 + json_line({"id": "a", "text": EN})
    result = clean_files(tmp_path, {"day.jsonl.gz": gzip.compress(raw, mtime=0)}, CONFIG)
    assert result.texts() == {"a": EN}


@pytest.mark.parametrize("encoding", ["utf-8", "gbk"])
def test_gzipped_csv(tmp_path: Path, encoding: str) -> None:
    raw = csv_bytes([["a", ZH, "zh"], ["b", ZH2, "zh"], ["c", "short", ""]], encoding=encoding)
    result = clean_files(tmp_path, {"day.csv.gz": gzip.compress(raw, mtime=0)}, CONFIG)
    assert result.texts() == {"a": ZH, "b": ZH2, "c": "short"}
    assert [row["lang"] for row in result.clean] == ["zh", "zh", None]  # empty cell -> None


# ---- Parquet ----------------------------------------------------------------------------
def test_parquet_string_columns(tmp_path: Path) -> None:
    table = pa.table(
        {
            "id": ["a", "b", None, "d"],
            "text": [EN, ZH, "A row without an identifier.", None],
            "lang": ["de", "zh", None, None],
            "created_at": [dt.datetime(2026, 1, 1, 12, 30), dt.datetime(2026, 1, 2), None, None],
        }
    )
    result = clean_files(tmp_path, {"day.parquet": parquet_bytes(table)}, CONFIG)
    assert result.metrics["rows_in"] == 4
    assert result.texts() == {"a": EN, "b": ZH}
    assert [row["created_at"] for row in result.clean] == ["2026-01-01T12:30:00", "2026-01-02T00:00:00"]
    assert result.reasons == {"missing_field": 2}
    assert [row["line"] for row in result.quarantine] == [3, 4]


def test_parquet_binary_columns_holding_gbk(tmp_path: Path) -> None:
    table = pa.table(
        {
            "id": pa.array([b"g1", b"g2", b"g3"], pa.binary()),
            "text": pa.array([ZH.encode("gbk"), ZH2.encode("gbk"), ZH3.encode("gbk")], pa.binary()),
        }
    )
    result = clean_files(tmp_path, {"legacy.parquet": parquet_bytes(table)}, CONFIG)
    assert result.reasons == {}
    assert result.texts() == {"g1": ZH, "g2": ZH2, "g3": ZH3}


def test_parquet_binary_cells_mixing_encodings_are_decoded_per_cell(tmp_path: Path) -> None:
    table = pa.table(
        {
            "id": pa.array([b"u1", b"g1", b"x1"], pa.large_binary()),
            "text": pa.array(
                [(ZH + " x").encode("utf-8"), ZH2.encode("gbk"), b"\xff\xfe not text at all"], pa.large_binary()
            ),
        }
    )
    result = clean_files(tmp_path, {"mixed.parquet": parquet_bytes(table)}, CONFIG)
    assert result.texts() == {"u1": ZH + " x", "g1": ZH2}
    assert result.reasons == {"undecodable": 1}
    assert result.quarantine[0]["line"] == 3


def test_parquet_wrong_types_and_missing_columns(tmp_path: Path) -> None:
    numeric_id = pa.table({"id": pa.array([1, 2], pa.int64()), "text": [EN, ZH]})
    no_text = pa.table({"id": ["a"], "body": [EN]})
    result = clean_files(
        tmp_path, {"a.parquet": parquet_bytes(numeric_id), "b.parquet": parquet_bytes(no_text)}, CONFIG
    )
    assert result.metrics["rows_in"] == 3 and result.metrics["rows_clean"] == 0
    assert result.reasons == {"wrong_type": 2, "missing_field": 1}
    assert [(row["source_file"], row["line"], row["reason"]) for row in result.quarantine] == [
        ("a.parquet", 1, "wrong_type"),
        ("a.parquet", 2, "wrong_type"),
        ("b.parquet", 1, "missing_field"),
    ]


def test_unreadable_parquet_is_one_unreadable_record(tmp_path: Path) -> None:
    result = clean_files(tmp_path, {"junk.parquet": b"this is not parquet at all"}, CONFIG)
    assert result.metrics["rows_in"] == 1 and result.reasons == {"unreadable": 1}
    assert result.metrics["rows_expected"] == 1
    assert (result.quarantine[0]["source_file"], result.quarantine[0]["line"]) == ("junk.parquet", 0)


# ---- line structure ---------------------------------------------------------------------
def test_jsonl_blank_lines_and_crlf(tmp_path: Path) -> None:
    data = b'{"id": "a", "text": "first document"}\r\n\r\n   \n{"id": "b", "text": "second document"}\r\n{"x"\r\n'
    result = clean_files(tmp_path, {"crlf.jsonl": data}, CONFIG)
    assert result.metrics["rows_in"] == 3  # blank lines are not records
    assert [(row["id"], row["line"]) for row in result.clean] == [("a", 1), ("b", 4)]
    assert [(row["line"], row["raw"]) for row in result.quarantine] == [(5, b'{"x"')]


def test_csv_quoted_multiline_field_and_line_numbers(tmp_path: Path) -> None:
    data = b'id ,  text\na,"line one\nline two, with comma"\nb,plain second row\n'
    result = clean_files(tmp_path, {"multi.csv": data}, CONFIG)
    assert result.texts() == {"a": "line one\nline two, with comma", "b": "plain second row"}
    assert [row["line"] for row in result.clean] == [2, 4]


def test_empty_and_header_only_csv_have_no_records(tmp_path: Path) -> None:
    result = clean_files(tmp_path, {"a.csv": b"", "b.csv": b"id,text\n"}, CONFIG)
    assert result.metrics["rows_in"] == 0 and result.clean == [] and result.quarantine == []


def test_bom_dispatch_and_strict_decoding() -> None:
    assert bom_encoding(codecs.BOM_UTF8 + b"x") == ("utf-8", 3)
    assert bom_encoding(codecs.BOM_UTF16_LE + b"x\x00") == ("utf-16-le", 2)
    assert bom_encoding(codecs.BOM_UTF16_BE + b"\x00x") == ("utf-16-be", 2)
    assert bom_encoding(codecs.BOM_UTF32_LE + b"x") == ("utf-32-le", 4)
    assert bom_encoding(b"plain") is None
    assert decode_unit("中文".encode())[:2] == ("中文", "utf-8")
    assert decode_unit(ZH.encode("gbk"))[:2] == (ZH, "gb18030")
    assert decode_unit(b"\xff").reason == "undecodable"


def test_data_file_suffixes(tmp_path: Path) -> None:
    for name in ("a.jsonl", "a.jsonl.gz", "a.csv", "a.csv.gz", "a.parquet"):
        assert is_data_file(name)
    for name in ("a.json", "a.txt", "README.md", ".a.jsonl", "a.jsonl.tmp", "a.gz"):
        assert not is_data_file(name)
    with pytest.raises(ValueError, match="not a data file"):
        read_records(tmp_path / "x.txt", "x.txt")


# ---- unreadable compressed files ---------------------------------------------------------
@pytest.mark.parametrize("name", ["broken.jsonl.gz", "broken.csv.gz"])
def test_corrupt_gzip_file_is_quarantined_not_fatal(tmp_path: Path, name: str) -> None:
    """Like an unreadable Parquet file, a .gz that is not gzip is one `unreadable` record
    naming its byte range, and the partition's other files still come through."""
    files = {"good.jsonl": jsonl({"id": "a", "text": EN}), name: b"\x1f\x8b this is not a gzip stream"}
    result = clean_files(tmp_path, files, CONFIG)
    assert result.texts() == {"a": EN}
    assert result.reasons == {"unreadable": 1}
    assert result.quarantine[0]["source_file"] == name
    assert "compressed bytes 0-" in result.quarantine[0]["detail"]


def test_truncated_gzip_keeps_the_rows_before_the_cut(tmp_path: Path) -> None:
    rows = [{"id": f"r{i}", "text": f"Row number {i} of a file that was cut off in transit."} for i in range(200)]
    cut = gzip.compress(jsonl(*rows), mtime=0)[:-40]
    result = clean_files(tmp_path, {"cut.jsonl.gz": cut}, CONFIG)
    assert result.metrics["rows_in"] == result.metrics["rows_clean"] + result.metrics["rows_quarantined"]
    assert result.metrics["rows_clean"] >= 150
    assert result.metrics["rows_expected"] == result.metrics["rows_in"]
    assert result.quarantine[-1]["reason"] == "unreadable"
    assert result.quarantine[-1]["source_file"] == "cut.jsonl.gz"


# ---- found in review: each of these lost, invented or garbled rows before -------------------
def conserved(result) -> None:
    metrics = result.metrics
    assert metrics["rows_expected"] == metrics["rows_in"] == metrics["rows_clean"] + metrics["rows_quarantined"]
    clean_lines = [(row["source_file"], row["line"]) for row in result.clean]
    assert len(set(clean_lines)) == len(clean_lines)
    assert set(clean_lines).isdisjoint((row["source_file"], row["line"]) for row in result.quarantine)


@pytest.mark.parametrize(
    "data, reasons",
    [
        (b"id,text\n,\nx,hello world\n", {"missing_field": 1}),
        (b'id,text\n"",""\n""\n"x","y text here"\n', {"missing_field": 1, "malformed_row": 1}),
    ],
)
def test_csv_rows_of_empty_fields_are_records(tmp_path: Path, data: bytes, reasons: dict) -> None:
    result = clean_files(tmp_path, {"a.csv": data}, CONFIG)
    conserved(result)
    assert result.reasons == reasons and result.metrics["rows_clean"] == 1


def test_whatever_follows_a_member_failing_its_crc_is_accounted_for(tmp_path: Path) -> None:
    bad_crc = bytearray(gzip.compress(jsonl({"id": "a", "text": EN}), mtime=0))
    bad_crc[-8] ^= 1
    second = gzip.compress(jsonl({"id": "b", "text": ZH}, {"id": "c", "text": ZH2}), mtime=0)
    third = gzip.compress(jsonl({"id": "d", "text": ZH3}), mtime=0)
    result = clean_files(tmp_path, {"a.jsonl.gz": bytes(bad_crc) + second[:-20] + b"JUNK" + third}, CONFIG)
    conserved(result)
    assert result.texts() == {"d": ZH3}
    assert result.reasons == {"unreadable": 2}  # the suspect line, and the truncated member with the junk


def test_an_abandoned_quoted_field_is_not_parsed_as_new_records(tmp_path: Path) -> None:
    data = b'id,text\na,"Hello first line\n\xff\xfe bad\nx,continued text of a"\ny,normal row here\n'
    result = clean_files(tmp_path, {"a.csv": data}, CONFIG)
    conserved(result)
    assert result.texts() == {"y": "normal row here"}
    assert result.reasons == {"undecodable": 1}


def test_an_oversized_record_with_a_literal_quote_ends_at_its_line(tmp_path: Path) -> None:
    config = DataConfig(min_chars=5, max_record_bytes=1024, batch_rows=3)
    data = b'id,text\nbig,5" screen ' + b"x" * 2000 + b"\ngood1,first good row\ngood2,second good row\n"
    result = clean_files(tmp_path, {"a.csv": data}, config)
    conserved(result)
    assert result.texts() == {"good1": "first good row", "good2": "second good row"}
    assert result.reasons == {"record_too_large": 1}


def test_an_oversized_quoted_field_is_skipped_to_its_closing_quote(tmp_path: Path) -> None:
    config = DataConfig(min_chars=5, max_record_bytes=1024, batch_rows=3)
    long_field = b"\n".join([b"x" * 300] * 8)
    data = b'id,text\nbig,"' + long_field + b'"\ngood1,first good row\n'
    result = clean_files(tmp_path, {"a.csv": data}, config)
    conserved(result)
    assert result.texts() == {"good1": "first good row"}
    assert result.reasons == {"record_too_large": 1}


def test_a_csv_that_never_gets_past_its_header_is_not_lost_silently(tmp_path: Path) -> None:
    data = b'"id","text"\r"a","first document text"\r"b","second document text"\r'  # lone CRs (old Mac Excel)
    result = clean_files(tmp_path, {"a.csv": data}, CONFIG)
    conserved(result)
    assert result.reasons == {"malformed_row": 1}
    assert result.quarantine[0]["raw"].startswith(b'"id","text"')


def test_a_footer_promising_more_rows_than_its_row_groups_hold(tmp_path: Path) -> None:
    sink = pa.BufferOutputStream()
    pq.write_table(
        pa.table({"id": [f"i{i}" for i in range(200)], "text": [f"text number {i} here" for i in range(200)]}),
        sink,
        row_group_size=100,
    )
    data = sink.getvalue().to_pybytes()
    footer_length = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_length
    footer = data[start:-8]
    assert footer.count(b"\x16\x90\x03") == 1  # FileMetaData.num_rows = 200 (zigzag varint)
    patched = data[:start] + footer.replace(b"\x16\x90\x03", b"\x16\x92\x03") + data[-8:]  # now 201
    result = clean_files(tmp_path, {"a.parquet": patched}, CONFIG)
    conserved(result)
    assert result.metrics["rows_clean"] == 200 and result.reasons == {"unreadable": 1}
    assert result.quarantine[0]["line"] == 201


def test_a_repeated_dictionary_value_is_converted_a_slice_at_a_time(tmp_path: Path) -> None:
    """4,096 rows sharing one 128 KiB text: 10 KB on disk, 512 MiB as Python strings if a
    whole batch were converted at once. Measured in a fresh process (ru_maxrss is a peak)."""
    script = f"""
import resource, sys
from pathlib import Path
import pyarrow as pa, pyarrow.parquet as pq
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from aieng_core.config import DataConfig
from tests.core.helpers import clean_files
table = pa.table({{"id": [f"id{{i}}" for i in range(4096)], "text": pa.array(["t" * 131072] * 4096).dictionary_encode()}})
pq.write_table(table, {str(tmp_path / "dict.parquet")!r}, compression="zstd")
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
result = clean_files(Path({str(tmp_path / "work")!r}), {{"a.parquet": Path({str(tmp_path / "dict.parquet")!r}).read_bytes()}},
                     DataConfig(max_chars=1 << 20, batch_bytes=1 << 16))
assert result.metrics["rows_in"] == 4096 and result.reasons == {{"duplicate_text": 4095}}, result.reasons
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) < 200  # MiB of growth; 792 before slices were bounded
