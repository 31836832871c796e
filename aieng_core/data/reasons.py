"""Why a row was quarantined. These exact strings are part of the data contract."""

MALFORMED_JSON = "malformed_json"  # a JSONL line that is not valid JSON
MALFORMED_ROW = "malformed_row"  # not a record: wrong CSV field count, JSON that is not an object, unreadable file
UNDECODABLE = "undecodable"  # bytes that are neither UTF-8 nor GB18030 (and carry no BOM)
MISSING_FIELD = "missing_field"  # `id` or `text` absent or null, or `id` blank
WRONG_TYPE = "wrong_type"  # a field of the wrong type, e.g. a numeric id
EMPTY_TEXT = "empty_text"  # text empty or whitespace-only after cleaning
TOO_SHORT = "too_short"  # clean text shorter than data.min_chars
TOO_LONG = "too_long"  # clean text longer than data.max_chars
DUPLICATE_ID = "duplicate_id"  # an earlier clean row of the partition has this id
DUPLICATE_TEXT = "duplicate_text"  # an earlier clean row of the partition has exactly this text

ALL_REASONS = (
    MALFORMED_JSON,
    MALFORMED_ROW,
    UNDECODABLE,
    MISSING_FIELD,
    WRONG_TYPE,
    EMPTY_TEXT,
    TOO_SHORT,
    TOO_LONG,
    DUPLICATE_ID,
    DUPLICATE_TEXT,
)
