"""validate_batch: the data contract, one batch at a time, each failing row with its reason."""

from __future__ import annotations

import unicodedata

import pytest

from aieng_core.data import reasons
from aieng_core.data.contract import MAX_ID_CHARS, validate_batch


def validate_one(record: dict) -> dict | tuple[str, str]:
    [result] = validate_batch([record])
    return result


def test_a_valid_record_comes_back_with_only_the_contract_fields() -> None:
    record = {"id": "a", "text": "Some text.", "source": "web", "lang": "en", "created_at": "2030-01-01", "extra": 1}
    assert validate_one(record) == {
        "id": "a",
        "text": "Some text.",
        "source": "web",
        "lang": "en",
        "created_at": "2030-01-01",
    }


def test_results_keep_the_order_of_the_records() -> None:
    records = [
        {"id": "a", "text": "x"},
        {"id": 1, "text": "x"},
        {"id": "b", "text": "y"},
        {"text": "x"},
        {"id": "c", "text": "z"},
    ]
    results = validate_batch(records)
    assert [r["id"] if isinstance(r, dict) else r[0] for r in results] == [
        "a",
        reasons.WRONG_TYPE,
        "b",
        reasons.MISSING_FIELD,
        "c",
    ]


def test_empty_optional_fields_count_as_absent() -> None:
    assert validate_one({"id": "a", "text": "x", "source": "", "lang": "", "created_at": ""}) == {
        "id": "a", "text": "x", "source": None, "lang": None, "created_at": None,
    }  # fmt: skip
    assert validate_one({"id": "a", "text": "x", "lang": None}) == {"id": "a", "text": "x", "lang": None}


@pytest.mark.parametrize(
    "record, detail",
    [
        ({"text": "x"}, "id is missing"),
        ({"id": None, "text": "x"}, "id is missing"),
        ({"id": "a"}, "text is missing"),
        ({"id": "a", "text": None}, "text is missing"),
        ({"id": "", "text": "x"}, "id is blank"),
        ({"id": "   \t", "text": "x"}, "id is blank"),
    ],
)
def test_missing_and_blank_fields(record: dict, detail: str) -> None:
    assert validate_one(record) == (reasons.MISSING_FIELD, detail)


@pytest.mark.parametrize(
    "invisible", ["\u200b", "\ufeff", "\x1c", " ", "\u200b\ufeff\x1c ", "\u2060\u00ad\u200d", "\u3164", "\U000e0041"]
)
def test_an_id_of_only_invisible_characters_is_blank(invisible: str) -> None:
    assert validate_one({"id": invisible, "text": "x"}) == (reasons.MISSING_FIELD, "id is blank")


@pytest.mark.parametrize(
    "record, got",
    [
        ({"id": 42, "text": "x"}, "int"),
        ({"id": True, "text": "x"}, "bool"),
        ({"id": "a", "text": ["a", "list"]}, "list"),
        ({"id": "a", "text": 12345}, "int"),
        ({"id": "a", "text": "x", "source": 5}, "int"),
        ({"id": "a", "text": "x", "lang": ["en"]}, "list"),
    ],
)
def test_types_are_strict(record: dict, got: str) -> None:
    reason, detail = validate_one(record)
    assert reason == reasons.WRONG_TYPE
    assert f"(got {got})" in detail


def test_the_first_failing_field_gives_the_reason() -> None:
    assert validate_one({"id": "\u200b", "text": 5}) == (reasons.MISSING_FIELD, "id is blank")


def test_composed_and_decomposed_ids_are_one_id() -> None:
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    results = validate_batch([{"id": composed, "text": "x"}, {"id": decomposed, "text": "y"}])
    assert [r["id"] for r in results] == [composed, composed]
    assert validate_one({"id": "\u212b", "text": "x"})["id"] == "\u00c5"  # ANGSTROM SIGN


def test_ids_up_to_the_limit_pass() -> None:
    assert validate_one({"id": "a" * MAX_ID_CHARS, "text": "x"})["id"] == "a" * MAX_ID_CHARS
    assert validate_one({"id": "e" + "\u0301" * 30, "text": "x"})["id"] == unicodedata.normalize(
        "NFC", "e" + "\u0301" * 30
    )


def test_an_id_over_1024_characters_is_invalid() -> None:
    assert MAX_ID_CHARS == 1024
    assert validate_one({"id": "a" * 1025, "text": "x"}) == (
        reasons.INVALID_ID,
        "id is 1025 characters, over the limit of 1024",
    )
    # Checked before any Unicode work: a long run of marks is rejected for its length alone.
    assert validate_one({"id": "a" + "\u0301" * 160_000, "text": "x"})[0] == reasons.INVALID_ID


@pytest.mark.parametrize("marks", ["\u0301" * 31, "\u0301\u0323" * 20, "\U0001d167" * 31, "\u0f73" * 31])
def test_an_id_with_a_run_of_more_than_30_combining_marks_is_invalid(marks: str) -> None:
    reason, detail = validate_one({"id": "id-" + marks, "text": "x"})
    assert reason == reasons.INVALID_ID
    assert detail.startswith(f"id holds a run of {len(marks)} combining marks at character 3")


def test_a_batch_with_every_kind_of_row() -> None:
    records = [
        {"id": "ok", "text": "x"},
        {"id": "\u200b", "text": "x"},
        {"id": "a" * 1025, "text": "x"},
        {"id": 7, "text": "x"},
        {"id": "cafe\u0301", "text": "x", "source": ""},
    ]
    assert [r if isinstance(r, tuple) else r["id"] for r in validate_batch(records)] == [
        "ok",
        (reasons.MISSING_FIELD, "id is blank"),
        (reasons.INVALID_ID, "id is 1025 characters, over the limit of 1024"),
        (reasons.WRONG_TYPE, "id: Input should be a valid string (got int)"),
        "caf\u00e9",
    ]
