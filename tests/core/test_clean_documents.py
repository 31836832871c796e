"""clean_documents: the data contract, every quarantine reason, de-duplication, accounting."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from aieng_core.config import DataConfig
from aieng_core.data import reasons
from aieng_core.data.clean_documents import KIND as CLEAN_KIND
from aieng_core.data.clean_documents import build_clean_documents, row_accounting
from aieng_core.data.demo_data import EXPECTED_DIRTY, GBK_CSV_TEXTS, GBK_JSONL_TEXT, day_documents
from aieng_core.data.raw_documents import build_raw_documents
from aieng_core.data.tables import CLEAN_FILE, CLEAN_SCHEMA, QUARANTINE_FILE, QUARANTINE_SCHEMA
from aieng_core.store import ArtifactStore
from tests.conftest import DEMO_PARTITIONS, land
from tests.core.helpers import BuiltHome, clean_files, jsonl, read_table

CONFIG = DataConfig(min_chars=10, max_chars=60, batch_rows=4)
GOOD = {"id": "good", "text": "A perfectly good document."}
QUARANTINE_COLUMNS = ["source_file", "line", "reason", "detail", "raw"]


def only(reason: str, count: int = 1) -> dict[str, int]:
    return {reason: count}


def assert_accounted(result) -> None:
    m = result.metrics
    assert m["rows_in"] == m["rows_clean"] + m["rows_quarantined"]
    assert m["rows_clean"] == len(result.clean)
    assert m["rows_quarantined"] == len(result.quarantine) == sum(m["reasons"].values())
    assert set(m["reasons"]) == set(reasons.ALL_REASONS)  # every reason reported, zeros included
    assert Counter(row["reason"] for row in result.quarantine) == Counter(result.reasons)


# ---- one test per reason, each with a clean row beside it -------------------------------
JSONL_CASES = {
    "malformed_json": [b'{"id": "x", "text": "cut off', b"{id: 'x'}", b'{"id": "x", "text": "a"} trailing'],
    "malformed_row": [b'["an", "array"]', b'"a bare string"', b"null", b"42"],
    "undecodable": [b'{"id": "x", "text": "caf\xe9 \xff\xfe"}', b"\xff"],
    "missing_field": [
        {"text": "A document without any id."},
        {"id": "x"},
        {"id": None, "text": "A document with a null id."},
        {"id": "x", "text": None},
        {"id": "", "text": "A document with an empty id."},
        {"id": "   \t", "text": "A document with a blank id."},
    ],
    "wrong_type": [
        {"id": 42, "text": "A document with a numeric id."},
        {"id": True, "text": "A document with a boolean id."},
        {"id": "x", "text": ["a", "list", "of", "words"]},
        {"id": "x", "text": {"nested": "object here"}},
        {"id": "x", "text": 12345678901234},
        {"id": "x", "text": "A document with a numeric source.", "source": 5},
        {"id": "x", "text": "A document with a list as lang.", "lang": ["en"]},
    ],
    "empty_text": [
        {"id": "x", "text": ""},
        {"id": "x", "text": "   "},
        {"id": "x", "text": " \t\x07 \n \u3000\u2028 "},
        {"id": "x", "text": "\x00\x01"},
    ],
    "too_short": [{"id": "x", "text": "ok."}, {"id": "x", "text": "  nine  \t chr "}],  # "nine chr" is 8
    "too_long": [{"id": "x", "text": "x" * 61}, {"id": "x", "text": "word " * 20}],
}


@pytest.mark.parametrize("reason", sorted(JSONL_CASES))
def test_each_bad_jsonl_row_gets_its_reason(tmp_path: Path, reason: str) -> None:
    bad_rows = JSONL_CASES[reason]
    data = jsonl(GOOD, *bad_rows)
    result = clean_files(tmp_path, {"day.jsonl": data}, CONFIG)
    assert result.reasons == only(reason, len(bad_rows))
    assert result.metrics["rows_in"] == 1 + len(bad_rows)
    assert result.texts() == {"good": GOOD["text"]}
    assert_accounted(result)
    lines = data.split(b"\n")
    for number, row in enumerate(result.quarantine, 2):
        assert (row["source_file"], row["line"], row["reason"]) == ("day.jsonl", number, reason)
        assert row["raw"] == lines[number - 1]  # the line exactly as read
        assert row["detail"]


def test_details_name_the_field(tmp_path: Path) -> None:
    data = jsonl(
        {"text": "no id here at all"},
        {"id": "x", "text": None},
        {"id": 7, "text": "numeric id here"},
        {"id": "   ", "text": "blank id here"},
    )
    result = clean_files(tmp_path, {"day.jsonl": data}, CONFIG)
    details = [row["detail"] for row in result.quarantine]
    assert details[0] == "id is missing"
    assert details[1] == "text is missing"
    assert details[2].startswith("id: ") and "int" in details[2]
    assert details[3] == "id is blank"


CSV_HEADER = b"id,text,source\n"


@pytest.mark.parametrize(
    "rows, reason",
    [
        ([b"x,two fields only"], "malformed_row"),
        ([b"x,a document with four,fields,surplus"], "malformed_row"),
        ([b",A row whose id cell is empty.,src"], "missing_field"),
        ([b"x,,src", b'y,"   \t  ",src'], "empty_text"),
        ([b"x,ok.,src"], "too_short"),
        ([b"x," + b"y" * 61 + b",src"], "too_long"),
        ([b"dup,Another text that reuses an id.,src"], "duplicate_id"),
        ([b"copy,A perfectly good document.,src"], "duplicate_text"),
    ],
)
def test_each_bad_csv_row_gets_its_reason(tmp_path: Path, rows: list[bytes], reason: str) -> None:
    data = CSV_HEADER + b"dup,A perfectly good document.,src\n" + b"".join(row + b"\n" for row in rows)
    result = clean_files(tmp_path, {"day.csv": data}, CONFIG)
    assert result.reasons == only(reason, len(rows))
    assert result.texts() == {"dup": "A perfectly good document."}
    assert [row["line"] for row in result.quarantine] == list(range(3, 3 + len(rows)))
    assert_accounted(result)


def test_quarantine_parquet_columns(tmp_path: Path) -> None:
    result = clean_files(tmp_path, {"day.jsonl": jsonl(GOOD, b"{broken", {"id": 1, "text": "numeric id text"})}, CONFIG)
    out = tmp_path / "out"
    assert pq.read_schema(out / QUARANTINE_FILE).names == QUARANTINE_COLUMNS
    assert pq.read_schema(out / QUARANTINE_FILE).remove_metadata() == QUARANTINE_SCHEMA
    assert pq.read_schema(out / CLEAN_FILE).remove_metadata() == CLEAN_SCHEMA
    assert [sorted(row) for row in result.quarantine] == [sorted(QUARANTINE_COLUMNS)] * 2
    assert [(r["line"], r["reason"], r["raw"]) for r in result.quarantine] == [
        (2, "malformed_json", b"{broken"),
        (3, "wrong_type", b'{"id": 1, "text": "numeric id text"}'),
    ]


def test_length_bounds_are_inclusive_and_measured_after_cleaning(tmp_path: Path) -> None:
    rows = [
        {"id": "min", "text": "0123456789"},  # exactly min_chars
        {"id": "min-1", "text": "012345678"},
        {"id": "spaced", "text": " \t 0123  \u3000 4567 \n"},  # 9 characters once cleaned
        {"id": "max", "text": "m" * 60},  # exactly max_chars
        {"id": "max+1", "text": "n" * 61},
        {"id": "ctrl", "text": "o" * 60 + "\x00\x01\x02"},  # controls do not count
    ]
    result = clean_files(tmp_path, {"day.jsonl": jsonl(*rows)}, CONFIG)
    assert sorted(result.texts()) == ["ctrl", "max", "min"]
    assert [(r["line"], r["reason"]) for r in result.quarantine] == [
        (2, "too_short"),
        (3, "too_short"),
        (5, "too_long"),
    ]
    assert result.texts()["ctrl"] == "o" * 60
    assert result.metrics["chars_clean"] == 10 + 60 + 60


def test_clean_rows_carry_cleaned_text_and_optional_fields(tmp_path: Path) -> None:
    rows = [
        {
            "id": "a",
            "text": "  Hello\t\tworld\x00!\n\n\n\nBye  ",
            "source": "web",
            "lang": "en",
            "created_at": "2026-01-01",
            "extra": 1,
        },
        {"id": "b", "text": "Second document here.", "source": "", "lang": None},
    ]
    result = clean_files(tmp_path, {"day.jsonl": jsonl(*rows)}, CONFIG)
    assert result.clean == [
        {
            "id": "a",
            "text": "Hello world!\n\nBye",
            "source": "web",
            "lang": "en",
            "created_at": "2026-01-01",
            "source_file": "day.jsonl",
            "line": 1,
        },
        {
            "id": "b",
            "text": "Second document here.",
            "source": None,
            "lang": None,
            "created_at": None,
            "source_file": "day.jsonl",
            "line": 2,
        },
    ]


# ---- de-duplication ---------------------------------------------------------------------
def test_duplicate_id_second_and_later_occurrences(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "text": "First text of id a."},
        {"id": "a", "text": "Second text of id a."},
        {"id": "b", "text": "Only text of id b."},
        {"id": "a", "text": "Third text of id a."},
        {"id": "a", "text": "First text of id a."},  # same id and text: the id is checked first
    ]
    result = clean_files(tmp_path, {"day.jsonl": jsonl(*rows)}, CONFIG)
    assert result.texts() == {"a": "First text of id a.", "b": "Only text of id b."}
    assert result.reasons == only("duplicate_id", 3)
    assert [r["line"] for r in result.quarantine] == [2, 4, 5]
    assert_accounted(result)


def test_an_id_is_taken_only_once_a_row_with_it_is_clean(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "text": "short"},  # too_short: does not take id a
        {"id": "a", "text": ""},  # empty_text: neither
        {"id": "b", "text": "A text that b has first."},
        {"id": "a", "text": "A text that b has first."},  # duplicate_text: still does not take a
        {"id": "a", "text": "Now id a finally has a clean row."},
        {"id": "a", "text": "And this one is a duplicate id."},
    ]
    result = clean_files(tmp_path, {"day.jsonl": jsonl(*rows)}, CONFIG)
    assert result.texts() == {"b": "A text that b has first.", "a": "Now id a finally has a clean row."}
    assert [(r["line"], r["reason"]) for r in result.quarantine] == [
        (1, "too_short"),
        (2, "empty_text"),
        (4, "duplicate_text"),
        (6, "duplicate_id"),
    ]


def test_duplicate_text_is_exact_after_cleaning_and_only_of_clean_rows(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "text": "The same words here."},
        {"id": "b", "text": "  The   same\twords here.\x00 "},  # identical once cleaned
        {"id": "c", "text": "The same words here!"},  # not exact: clean
        {"id": "c", "text": "A text first seen on a duplicate id row."},  # duplicate_id: text not recorded
        {"id": "d", "text": "A text first seen on a duplicate id row."},  # so this one is clean
        {"id": "e", "text": "the same words here."},  # case differs: clean
    ]
    result = clean_files(tmp_path, {"day.jsonl": jsonl(*rows)}, CONFIG)
    assert sorted(result.texts()) == ["a", "c", "d", "e"]
    assert [(r["line"], r["reason"]) for r in result.quarantine] == [(2, "duplicate_text"), (4, "duplicate_id")]


def test_deduplication_spans_files_and_batches(tmp_path: Path) -> None:
    first = jsonl(*[{"id": f"a{i}", "text": f"Text number {i} of file a."} for i in range(5)])
    second = (
        b"id,text\n"
        + b"a0,An id from the first file.\n"
        + b"b1,Text number 3 of file a.\n"
        + b"b2,A new text in the second file.\n"
    )
    config = DataConfig(min_chars=10, max_chars=60, batch_rows=2)
    result = clean_files(tmp_path, {"a.jsonl": first, "b.csv": second}, config)
    assert result.metrics["rows_in"] == 8
    assert result.reasons == {"duplicate_id": 1, "duplicate_text": 1}
    assert [(r["source_file"], r["line"], r["reason"]) for r in result.quarantine] == [
        ("b.csv", 2, "duplicate_id"),
        ("b.csv", 3, "duplicate_text"),
    ]
    assert [r["id"] for r in result.clean] == ["a0", "a1", "a2", "a3", "a4", "b2"]


MIXED = jsonl(
    GOOD,
    b"{bad json",
    {"id": 3, "text": "numeric id here"},
    {"id": "e", "text": "  "},
    {"text": "missing the identifier"},
    {"id": "good", "text": "Duplicate id of the first row."},
    {"id": "f", "text": "A perfectly good document."},
    {"id": "g", "text": "tiny"},
    b"\xff\xfe",
    {"id": "h", "text": "Another good document here."},
    b"[1, 2]",
    {"id": "i", "text": "z" * 70},
    {"id": "j", "text": "The last good document."},
)
MIXED_REASONS = {
    "malformed_json": 1,
    "wrong_type": 1,
    "empty_text": 1,
    "missing_field": 1,
    "duplicate_id": 1,
    "duplicate_text": 1,
    "too_short": 1,
    "undecodable": 1,
    "malformed_row": 1,
    "too_long": 1,
}


@pytest.mark.parametrize("batch_rows", [1, 2, 3, 5, 64])
def test_batch_size_changes_nothing(tmp_path: Path, batch_rows: int) -> None:
    result = clean_files(tmp_path, {"day.jsonl": MIXED}, DataConfig(min_chars=10, max_chars=60, batch_rows=batch_rows))
    assert result.reasons == MIXED_REASONS
    assert result.metrics["rows_in"] == 13 and result.metrics["rows_clean"] == 3
    assert [r["id"] for r in result.clean] == ["good", "h", "j"]
    assert [r["line"] for r in result.quarantine] == [2, 3, 4, 5, 6, 7, 8, 9, 11, 12]
    assert_accounted(result)
    reference = clean_files(
        tmp_path / "reference", {"day.jsonl": MIXED}, DataConfig(min_chars=10, max_chars=60, batch_rows=4)
    )
    assert result.content_sha256 == reference.content_sha256


def test_content_hash_ignores_file_names_of_clean_rows_but_not_text(tmp_path: Path) -> None:
    base = clean_files(tmp_path / "a", {"day.jsonl": jsonl(GOOD)}, CONFIG)
    renamed = clean_files(tmp_path / "b", {"other.jsonl": jsonl(GOOD)}, CONFIG)
    changed = clean_files(
        tmp_path / "c", {"day.jsonl": jsonl({"id": "good", "text": "A perfectly good document!"})}, CONFIG
    )
    assert base.content_sha256 == renamed.content_sha256
    assert changed.content_sha256 != base.content_sha256


def test_lone_surrogate_in_text_is_quarantined_not_fatal(tmp_path: Path) -> None:
    """JSON may escape a lone surrogate ("\\ud800"); json.loads accepts it, but it cannot be
    written as UTF-8. One such row must end in quarantine, not abort the whole partition."""
    bad = b'{"id": "s", "text": "a lone surrogate \\ud800 in a text"}'
    result = clean_files(tmp_path, {"day.jsonl": jsonl(GOOD, bad)}, CONFIG)
    assert result.texts() == {"good": GOOD["text"]}
    assert result.metrics["rows_quarantined"] == 1
    assert result.quarantine[0]["raw"] == bad
    assert result.quarantine[0]["reason"] in ("undecodable", "malformed_json")


# ---- as artifacts -----------------------------------------------------------------------
PARTITION = "2026-01-05"


def test_build_from_landed_files(store: ArtifactStore, home: Path, tiny_config) -> None:
    land(home, PARTITION, "a.jsonl", jsonl(GOOD, {"id": "x", "text": "ok"}, b"{oops"))
    land(home, PARTITION, "b.csv", b"id,text\ngood,Duplicate id row text.\ny,Another good document.\n")
    raw = build_raw_documents(store, tiny_config, PARTITION)
    clean = build_clean_documents(store, tiny_config, PARTITION)
    assert clean.manifest["inputs"] == [{"kind": "raw_documents", "id": raw.id}]
    assert clean.manifest["partition"] == PARTITION and clean.id.startswith(PARTITION)
    assert clean.metrics["rows_in"] == 5 and clean.metrics["rows_clean"] == 2
    assert {k: v for k, v in clean.metrics["reasons"].items() if v} == {
        "too_short": 1,
        "malformed_json": 1,
        "duplicate_id": 1,
    }
    assert row_accounting(clean) == {
        "passed": True,
        "rows_expected": 5,
        "rows_in": 5,
        "rows_clean": 2,
        "rows_quarantined": 3,
        "problems": [],
    }
    assert [r["id"] for r in read_table(clean.file(CLEAN_FILE))] == ["good", "y"]
    assert [(r["source_file"], r["line"]) for r in read_table(clean.file(QUARANTINE_FILE))] == [
        ("a.jsonl", 2),
        ("a.jsonl", 3),
        ("b.csv", 2),
    ]
    assert store.current(CLEAN_KIND, PARTITION).id == clean.id
    assert sorted(clean.manifest["files"]) == [CLEAN_FILE, QUARANTINE_FILE]


def test_rebuild_is_reused_and_changes_give_new_ids(store: ArtifactStore, home: Path, tiny_config) -> None:
    landed = land(home, PARTITION, "a.jsonl", jsonl(GOOD, {"id": "b", "text": "Second good document."}))
    build_raw_documents(store, tiny_config, PARTITION)
    first = build_clean_documents(store, tiny_config, PARTITION)
    again = build_clean_documents(store, tiny_config, PARTITION)
    assert again.reused and again.id == first.id
    stricter = tiny_config.model_copy(update={"data": DataConfig(min_chars=22, max_chars=1000, batch_rows=64)})
    strict = build_clean_documents(store, stricter, PARTITION)
    assert strict.id != first.id and strict.metrics["reasons"]["too_short"] == 1
    landed.write_bytes(jsonl(GOOD))
    build_raw_documents(store, tiny_config, PARTITION)
    changed = build_clean_documents(store, tiny_config, PARTITION)
    assert changed.id not in (first.id, strict.id) and changed.metrics["rows_in"] == 1


def test_row_accounting_counts_written_rows(store: ArtifactStore, home: Path, tiny_config) -> None:
    land(home, PARTITION, "a.jsonl", jsonl(GOOD, {"id": "x", "text": "ok"}))
    build_raw_documents(store, tiny_config, PARTITION)
    clean = build_clean_documents(store, tiny_config, PARTITION)
    lying = type(clean)(
        clean.kind, clean.id, clean.path, {**clean.manifest, "metrics": {**clean.metrics, "rows_in": 3}}
    )
    assert row_accounting(lying) == {
        "passed": False,
        "rows_expected": 2,
        "rows_in": 3,
        "rows_clean": 1,
        "rows_quarantined": 1,
        "problems": ["3 records read but 1 clean + 1 quarantined were written"],
    }


def test_row_accounting_catches_a_reader_that_loses_rows(
    store: ArtifactStore, home: Path, tiny_config, monkeypatch
) -> None:
    """The conservation check must not trust the reader: rows that a buggy reader never
    yields never enter rows_in, so only the independent count can notice them."""
    from aieng_core.data import readers

    land(
        home, PARTITION, "a.jsonl", jsonl(*({"id": f"r{i}", "text": f"document number {i} is here"} for i in range(10)))
    )
    build_raw_documents(store, tiny_config, PARTITION)
    honest = readers.read_jsonl

    def lossy(source, name, limits):
        return (record for record in honest(source, name, limits) if record.line != 4)

    monkeypatch.setattr(readers, "read_jsonl", lossy)
    clean = build_clean_documents(store, tiny_config, PARTITION)
    accounting = row_accounting(clean)
    assert (accounting["passed"], accounting["rows_expected"], accounting["rows_in"]) == (False, 10, 9)
    assert accounting["problems"][0] == "a.jsonl: read 9 records, the file holds 10 (non-blank lines)"


# ---- the demo data: every planted row, and nothing else, in quarantine ------------------
@pytest.mark.parametrize("day", [0, 1, 2])
def test_demo_partitions_quarantine_exactly_the_planted_rows(built_demo: BuiltHome, day: int) -> None:
    partition = DEMO_PARTITIONS[day]
    clean = built_demo.clean[partition]
    expected = {reason: EXPECTED_DIRTY[f"day{day + 1}"].get(reason, 0) for reason in reasons.ALL_REASONS}
    assert clean.metrics["reasons"] == expected
    extra_clean = {0: 1, 1: len(GBK_CSV_TEXTS), 2: 0}[day]  # the GBK rows are clean too
    assert clean.metrics["rows_clean"] == len(day_documents(day)) + extra_clean
    assert clean.metrics["rows_quarantined"] == sum(expected.values())
    assert clean.metrics["rows_in"] == clean.metrics["rows_clean"] + clean.metrics["rows_quarantined"]
    assert row_accounting(clean)["passed"]
    quarantined = read_table(clean.file(QUARANTINE_FILE))
    assert Counter(row["reason"] for row in quarantined) == Counter({k: v for k, v in expected.items() if v})


def test_demo_gbk_rows_are_recovered(built_demo: BuiltHome) -> None:
    day1 = {r["id"]: r["text"] for r in read_table(built_demo.clean["2026-01-01"].file(CLEAN_FILE))}
    assert day1["gbk-line"] == GBK_JSONL_TEXT
    day2 = {r["id"]: r["text"] for r in read_table(built_demo.clean["2026-01-02"].file(CLEAN_FILE))}
    assert [day2[f"legacy-gbk-{n}"] for n in range(1, 5)] == list(GBK_CSV_TEXTS)
    texts = [t for t in day1.values()] + [t for t in day2.values()]
    assert not any("\ufffd" in t for t in texts)
