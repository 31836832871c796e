"""The data contract every raw record must meet, as a pydantic model.

`id` is a string with something visible in it, `text` a string; `source`, `lang` and
`created_at` are optional strings. Types are strict: a numeric id is `wrong_type`, not
silently converted. Ids are NFC-normalised, so the composed and decomposed spellings of
"café" are one id; an id over 1,024 characters or with a run of more than 30 combining marks
is `invalid_id`, checked first so that normalising stays cheap. Records are validated a
batch at a time (one call into pydantic-core per batch rather than one model object per
row), and each failing row is mapped to its quarantine reason.
"""

from __future__ import annotations

import unicodedata
from typing import (
    Annotated,
    Any,
    NotRequired,  # pydantic needs this TypedDict on Python < 3.12
)

from pydantic import AfterValidator, ConfigDict, TypeAdapter, ValidationError, with_config
from pydantic_core import ErrorDetails, PydanticCustomError
from typing_extensions import TypedDict

from aieng_core.data import reasons
from aieng_core.data.cleaning import ExcessiveCombiningMarks, check_combining_marks, is_blank

OPTIONAL_FIELDS = ("source", "lang", "created_at")
MAX_ID_CHARS = 1024


def _valid_id(value: str) -> str:
    """The id, NFC-normalised; a blank or invalid id raises an error _reason maps below."""
    if is_blank(value):  # whitespace, control and invisible format characters only
        raise PydanticCustomError("id_blank", "id is blank")
    if len(value) > MAX_ID_CHARS:
        raise PydanticCustomError(
            "invalid_id",
            "id is {length} characters, over the limit of {limit}",
            {"length": len(value), "limit": MAX_ID_CHARS},
        )
    try:
        check_combining_marks(value)  # before NFC, which is quadratic in the length of such a run
    except ExcessiveCombiningMarks as exc:
        raise PydanticCustomError("invalid_id", "id holds {problem}", {"problem": str(exc)}) from None
    return unicodedata.normalize("NFC", value)  # returns ASCII and already-NFC ids as they are


@with_config(ConfigDict(strict=True, extra="ignore"))
class Document(TypedDict):
    id: Annotated[str, AfterValidator(_valid_id)]
    text: str
    source: NotRequired[str | None]
    lang: NotRequired[str | None]
    created_at: NotRequired[str | None]


_BATCH = TypeAdapter(list[Document])


def _reason(error: ErrorDetails) -> tuple[str, str]:
    field = ".".join(str(part) for part in error["loc"][1:]) or "record"
    kind = error["type"]
    if kind == "missing" or (error.get("input") is None and kind.endswith("_type")):
        return reasons.MISSING_FIELD, f"{field} is missing"
    if kind == "id_blank":
        return reasons.MISSING_FIELD, f"{field} is blank"
    if kind == "invalid_id":
        return reasons.INVALID_ID, error["msg"]
    return reasons.WRONG_TYPE, f"{field}: {error['msg']} (got {type(error.get('input')).__name__})"


def _without_empty_optionals(record: dict[str, Any]) -> dict[str, Any]:
    if "" not in (record.get("source"), record.get("lang"), record.get("created_at")):
        return record
    return {key: (None if key in OPTIONAL_FIELDS and value == "" else value) for key, value in record.items()}


def validate_batch(records: list[dict[str, Any]]) -> list[Document | tuple[str, str]]:
    """Validate records; each result is the validated document or (reason, detail).

    Empty optional fields count as absent, so CSV's empty cells and JSON's "" mean the same.
    """
    records = [_without_empty_optionals(record) for record in records]
    try:
        return list[Document | tuple[str, str]](_BATCH.validate_python(records))
    except ValidationError as exc:
        failures: dict[int, tuple[str, str]] = {}
        for error in exc.errors(include_url=False):
            failures.setdefault(int(error["loc"][0]), _reason(error))  # loc = (row index, field)
    # Validate the rest once more without the failing rows: pydantic reports errors, not values.
    good = [record for index, record in enumerate(records) if index not in failures]
    validated = iter(_BATCH.validate_python(good))
    return [failures[index] if index in failures else next(validated) for index in range(len(records))]
