"""Hostile landed files through clean_partition, in process: for every case of
tests/hostile/generator.py, the exact quarantine reasons, the exact clean texts and the exact
record count the reader spec promises. Plus the generator's own self-checks (that each crafted
input really is what its case says), and a Hypothesis property over random messy files.
"""

from __future__ import annotations

import faulthandler
import tempfile
import zlib
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aieng_core.config import load_config
from aieng_core.data import reasons
from tests.conftest import TINY_CONFIG
from tests.core.helpers import clean_files
from tests.hostile import generator as g
from tests.hostile.generator import Case, hostile_cases

CASES = hostile_cases()
CASE = {case.kind: case for case in CASES}
# Far above what any case needs (the slowest, gz_over_max_file_bytes, reads 256 MiB: seconds).
# faulthandler ends the process even inside a C loop (say, NFC of a quadratic run of marks).
WATCHDOG_S = 120
RAW_PREFIX = 4096  # record_too_large keeps the first 4096 bytes as raw


@pytest.fixture(scope="module")
def data_config():
    return load_config(TINY_CONFIG).data


@pytest.fixture
def watchdog():
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


# ---- the generator checks itself (independent of the readers) ------------------------------
def test_there_are_enough_hostile_kinds_within_a_modest_size() -> None:
    assert len(CASES) >= 70
    total = sum(case.landed_bytes for case in CASES)
    assert total < 48 << 20, total
    print(f"\n{len(CASES)} hostile kinds, {total:,} landed bytes, {sum(c.expected_records for c in CASES):,} records")


def test_reason_names_are_the_contract_reasons() -> None:
    assert set(g.REASONS) == set(reasons.ALL_REASONS)
    used = {reason for case in CASES for reason in case.expected_reasons}
    assert used <= set(reasons.ALL_REASONS)


def test_every_reason_is_exercised_somewhere() -> None:
    used = {reason for case in CASES for reason in case.expected_reasons}
    assert used == set(g.REASONS)


def test_ids_texts_and_file_names_never_collide_across_cases() -> None:
    """All cases share one partition in the e2e run, where duplicate_id and duplicate_text
    apply across files; so no clean id or text may repeat between cases."""
    ids = [doc_id for case in CASES for doc_id in case.expected_clean]
    texts = [text for case in CASES for text in case.expected_clean.values()]
    names = [name for case in CASES for name in case.files]
    assert [i for i, n in Counter(ids).items() if n > 1] == []
    assert [t[:60] for t, n in Counter(texts).items() if n > 1] == []
    assert [n for n, c in Counter(names).items() if c > 1] == []
    for case in CASES:
        for name in case.files:
            assert name.startswith(case.kind), (case.kind, name)
            name.encode("utf-8")


def test_clean_expectations_are_within_the_tiny_limits() -> None:
    for case in CASES:
        for doc_id, text in case.expected_clean.items():
            assert g.MIN_CHARS <= len(text) <= g.MAX_CHARS, (case.kind, doc_id)
            assert text == text.strip()
            assert 0 < len(doc_id) <= g.MAX_ID_CHARS


def test_tiny_config_has_the_limits_the_cases_assume(data_config) -> None:
    assert data_config.min_chars == g.MIN_CHARS
    assert data_config.max_chars == g.MAX_CHARS
    assert data_config.max_record_bytes == g.MAX_RECORD_BYTES
    assert data_config.max_file_bytes == g.MAX_FILE_BYTES
    assert list(data_config.fallback_encodings) == ["gb18030"]


@pytest.mark.parametrize(
    "unit, verdict",
    [(unit, verdict) for case in CASES for unit, verdict in case.encoding_units],
    ids=[f"{case.kind}-{n}" for case in CASES for n, _ in enumerate(case.encoding_units)],
)
def test_encoded_units_get_the_verdict_their_case_claims(unit: bytes, verdict: str) -> None:
    assert g.spec_verdict(unit) == verdict


@pytest.mark.parametrize(
    "unit, verdict",
    [
        ("Zürich".encode("latin-1"), g.AMBIGUOUS_ENCODING),
        ("Müller".encode("cp1252"), g.AMBIGUOUS_ENCODING),
        (b"\xed\xa0\xbd\xed\xb8\x80", g.AMBIGUOUS_ENCODING),
        (b"\xc0\x80", g.AMBIGUOUS_ENCODING),
        (b"\xe0\x80\xaf", g.UNDECODABLE),  # alone, 0xAF has no trail byte
        ("数据管道".encode("gbk"), g.AS_GB18030),
        ("数据管道".encode(), g.AS_UTF8),
        ("朱镕基总理讲话数据管道".encode("gbk"), g.AS_GB18030),  # 1 code in 11 outside GB2312
        ("這個資料".encode("gbk"), g.AMBIGUOUS_ENCODING),  # 3 in 4
        ("数据😀".encode("gb18030"), g.AMBIGUOUS_ENCODING),  # a four-byte sequence
    ],
)
def test_spec_verdict_matches_the_spec_examples(unit: bytes, verdict: str) -> None:
    assert g.spec_verdict(unit) == verdict


def _stream_lines(data: bytes) -> tuple[int, int]:
    """(decompressed bytes, newlines) of a gzip file, streamed."""
    decompressor = zlib.decompressobj(31)
    size = lines = 0
    view = memoryview(data)
    for start in range(0, len(data), 1 << 16):
        chunk = decompressor.decompress(view[start : start + (1 << 16)])
        while chunk:
            size += len(chunk)
            lines += chunk.count(b"\n")
            chunk = decompressor.decompress(decompressor.unconsumed_tail) if decompressor.unconsumed_tail else b""
    assert decompressor.eof
    return size, lines


def test_gzip_bombs_decompress_to_what_their_cases_claim() -> None:
    bomb = CASE["gz_bomb_line"].files["gz_bomb_line.jsonl.gz"]
    size, lines = _stream_lines(bomb)
    assert size > 200 << 20 and lines == 3
    assert len(bomb) < 512 << 10
    over = CASE["gz_over_max_file_bytes"].files["gz_over_max_file_bytes.jsonl.gz"]
    size, _ = _stream_lines(over)
    assert size > g.MAX_FILE_BYTES + (32 << 20)
    wide = CASE["gz_wide_rows"].files["gz_wide_rows.jsonl.gz"]
    text = zlib.decompress(wide, 31)
    rows = text.split(b"\n")
    assert rows[-1] == b"" and len(rows) == 65
    assert all(600_000 < len(row) < g.MAX_RECORD_BYTES - 4096 for row in rows[:-1])
    import json

    first, last = json.loads(rows[0]), json.loads(rows[63])
    assert len(first) == len(last) == 100_002
    assert list(first)[:2] == ["id", "text"] and list(last)[-2:] == ["id", "text"]


def test_gzip_damage_is_where_the_cases_say() -> None:
    truncated = CASE["gz_truncated"].files["gz_truncated.jsonl.gz"]
    decompressor = zlib.decompressobj(31)
    prefix = decompressor.decompress(truncated)
    assert not decompressor.eof
    assert prefix.count(b"\n") == 30 and prefix.endswith(b"\n")

    for kind, name, damaged_index, count in (
        ("gz_damaged_member", "gz_damaged_member.jsonl.gz", 2, 5),
        ("gz_damaged_member_csv", "gz_damaged_member_csv.csv.gz", 1, 4),
    ):
        data = CASE[kind].files[name]
        members = [b"\x1f\x8b" + part for part in data.split(b"\x1f\x8b")[1:]]
        assert len(members) == count
        for index, member in enumerate(members):
            decompressor = zlib.decompressobj(31)
            if index == damaged_index:
                with pytest.raises(zlib.error, match="invalid block type"):
                    decompressor.decompress(member)
            else:
                assert decompressor.decompress(member).endswith(b"\n") and decompressor.eof

    padded = CASE["gz_zero_padding"].files["gz_zero_padding.jsonl.gz"]
    assert padded.endswith(b"\x00" * 1024)
    split = CASE["gz_member_splits_line"].files["gz_member_splits_line.jsonl.gz"]
    import gzip

    assert gzip.decompress(split).count(b"\n") == 12


@pytest.mark.parametrize("kind", ["pq_damaged_page", "pq_damaged_page_snappy"])
def test_damaged_parquet_loses_exactly_one_row_group(kind: str) -> None:
    data = CASE[kind].files[f"{kind}.parquet"]
    parquet = pq.ParquetFile(pa.BufferReader(data))
    assert parquet.metadata.num_rows == 50 and parquet.num_row_groups == 5
    for group in range(5):
        assert g.row_group_unreadable(data, group) == (group == 2)


def test_parquet_hazards_are_real() -> None:
    """The ignored columns really do break a naive whole-row read."""
    for kind, error in (
        ("pq_timestamp_out_of_range_ignored", (ValueError, OverflowError)),
        ("pq_unknown_timezone", Exception),
        ("pq_invalid_utf8_cells", UnicodeDecodeError),
    ):
        table = pq.read_table(pa.BufferReader(CASE[kind].files[f"{kind}.parquet"]))
        with pytest.raises(error):
            table.to_pylist()
    with pytest.raises(Exception):  # noqa: B017 -- pyarrow's error type for a missing footer varies by version
        pq.ParquetFile(pa.BufferReader(CASE["pq_no_footer"].files["pq_no_footer.parquet"]))


# ---- every case through clean_partition -----------------------------------------------------
def _lines(rows: list[dict]) -> list[tuple[str, int, str]]:
    return sorted((row["source_file"], row["line"], row["reason"]) for row in rows)


@pytest.mark.parametrize("case", CASES, ids=[case.kind for case in CASES])
def test_hostile_case(tmp_path: Path, case: Case, data_config, watchdog) -> None:
    result = clean_files(tmp_path, case.files, data_config)
    metrics = result.metrics
    got_reasons = dict(Counter(row["reason"] for row in result.quarantine))
    assert got_reasons == case.expected_reasons, case.note
    assert result.texts() == case.expected_clean, case.note
    assert metrics["rows_in"] == case.expected_records == len(result.clean) + len(result.quarantine)
    assert {r: n for r, n in metrics["reasons"].items() if n} == case.expected_reasons
    assert metrics["rows_clean"] == len(case.expected_clean)
    if case.quarantine_lines is not None:
        assert _lines(result.quarantine) == list(case.quarantine_lines)
    if case.clean_lines is not None:
        assert {row["id"]: (row["source_file"], row["line"]) for row in result.clean} == case.clean_lines
    for row in result.quarantine:
        if row["reason"] == g.RECORD_TOO_LARGE:
            assert len(row["raw"]) == RAW_PREFIX


# One case of each reading path: the independent count the spec adds to the metrics.
METRIC_KINDS = [
    "utf16le_10k",
    "mixed_gbk_utf8_lines",
    "blank_and_crlf_lines",
    "csv_multiline_with_gbk",
    "csv_unterminated_quote",
    "csv_record_size_limit",
    "duplicates_across_files",
    "empty_csv",
    "gz_damaged_member",
    "gz_truncated",
    "gz_damaged_member_csv",
    "pq_damaged_page",
    "pq_no_footer",
    "pq_invalid_utf8_cells",
]


def files_metric(metrics: dict) -> dict[str, dict]:
    """metrics["files"] (a list of {"name", "expected", "read", "count_source"}, one per file), by name."""
    files = {entry["name"]: entry for entry in metrics["files"]}
    assert len(files) == len(metrics["files"]), "a file is listed twice"
    return files


@pytest.mark.parametrize("kind", METRIC_KINDS)
def test_metrics_carry_the_independent_count(tmp_path: Path, kind: str, data_config, watchdog) -> None:
    case = CASE[kind]
    metrics = clean_files(tmp_path, case.files, data_config).metrics
    assert metrics["rows_expected"] == metrics["rows_in"] == case.expected_records
    files = files_metric(metrics)
    assert set(files) == set(case.files)
    for name, entry in files.items():
        assert entry["expected"] == entry["read"], name
        assert isinstance(entry["count_source"], str) and entry["count_source"]
    assert sum(entry["expected"] for entry in files.values()) == case.expected_records


# ---- a property over random messy files -----------------------------------------------------
WORDS = ["alpha", "beta", "数据", "管道", "Zürich", "café", "e\u0301", "\u200b", "<|pad|>", "x" * 12]
FIELD_TEXT = st.lists(st.sampled_from(WORDS + [" ", "\t", "\x0b", "\u2028"]), max_size=8).map("".join)
ENCODINGS = ["utf-8", "gbk", "latin-1", "cp1252", "utf-16-le", "gb18030"]
BLANKS = [b"", b" ", b"\t", b"\r", b"\x0b\x0c", b" \t\r "]
BOMS = (b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")


def _encoded(text: str, encoding: str) -> bytes:
    return text.encode(encoding, errors="replace").replace(b"\n", b" ")


@st.composite
def jsonl_line(draw) -> bytes:
    kind = draw(st.sampled_from(["good", "good", "encoded", "garbage", "blank", "non_object", "broken"]))
    record = {"id": f"p-{draw(st.integers(0, 30))}", "text": draw(FIELD_TEXT)}
    if kind == "good":
        return g.dumps(record)
    if kind == "encoded":
        return _encoded(g.dumps(record).decode(), draw(st.sampled_from(ENCODINGS)))
    if kind == "garbage":
        return draw(st.binary(max_size=30)).replace(b"\n", b"")
    if kind == "blank":
        return draw(st.sampled_from(BLANKS))
    if kind == "non_object":
        return draw(st.sampled_from([b"[]", b"1", b'"s"', b"null", b"[[[[[["]))
    return g.dumps(record)[: draw(st.integers(1, 10))]


@st.composite
def csv_line(draw) -> bytes:
    kind = draw(st.sampled_from(["good", "good", "encoded", "garbage", "blank", "fields", "quoted"]))
    doc_id, text = f"q-{draw(st.integers(0, 30))}", draw(FIELD_TEXT).replace(",", " ")
    if kind == "good":
        return f"{doc_id},{text}".encode()
    if kind == "encoded":
        return _encoded(f"{doc_id},{text}", draw(st.sampled_from(ENCODINGS)))
    if kind == "garbage":
        return draw(st.binary(max_size=30)).replace(b"\n", b"")
    if kind == "blank":
        return draw(st.sampled_from(BLANKS))
    if kind == "fields":
        return f"{doc_id},{text},{text}".encode()
    return draw(
        st.sampled_from([f'{doc_id},"{text}"', f'{doc_id},"{text}" tail', f'{doc_id},"open', f'close",{doc_id}'])
    ).encode()


@st.composite
def landed_file(draw, index: int) -> tuple[str, bytes]:
    if draw(st.booleans()):
        lines = draw(st.lists(jsonl_line(), max_size=12))
        name = f"f{index}.jsonl"
    else:
        lines = [draw(st.sampled_from([b"id,text", b"id,text,source", b" id , text "]))] + draw(
            st.lists(csv_line(), max_size=12)
        )
        name = f"f{index}.csv"
    data = b"\n".join(lines) + (b"\n" if draw(st.booleans()) else b"")
    if data.startswith(BOMS):
        data = b"\n" + data  # a BOM would make this a different (wide) file
    return name, data


def _nonblank_lines(data: bytes) -> list[int]:
    """1-based numbers of the physical lines that are not blank (only ASCII whitespace)."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return [number for number, line in enumerate(lines, 1) if line.strip(b" \t\r\x0b\x0c")]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.integers(1, 3).flatmap(lambda count: st.tuples(*(landed_file(index) for index in range(count)))))
def test_random_messy_files_are_accounted_for_line_by_line(files: tuple[tuple[str, bytes], ...]) -> None:
    config = load_config(TINY_CONFIG).data
    landed = dict(files)
    with tempfile.TemporaryDirectory() as directory:
        result = clean_files(Path(directory), landed, config)
    metrics = result.metrics
    clean = [(row["source_file"], row["line"]) for row in result.clean]
    quarantined = [(row["source_file"], row["line"]) for row in result.quarantine]
    assert set(clean).isdisjoint(quarantined)
    assert len(set(clean + quarantined)) == len(clean) + len(quarantined)
    assert metrics["rows_in"] == len(clean) + len(quarantined) == metrics["rows_clean"] + metrics["rows_quarantined"]
    # The independent count: JSONL records are the non-blank lines; a CSV without quote bytes
    # has one record per non-blank line after the header.
    expected = 0
    for name, data in landed.items():
        nonblank = _nonblank_lines(data)
        seen = sorted(line for source, line in clean + quarantined if source == name)
        if name.endswith(".jsonl"):
            assert seen == nonblank, name
            expected += len(nonblank)
        elif b'"' not in data:
            assert seen == nonblank[1:], name
            expected += max(len(nonblank) - 1, 0)
        else:
            expected = None
            break
    if expected is not None:
        assert metrics["rows_in"] == expected
