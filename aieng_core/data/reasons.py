"""Why a row was quarantined. These exact strings are part of the data contract."""

MALFORMED_JSON = "malformed_json"  # a JSONL line that is not valid JSON (or nested too deep to parse)
MALFORMED_ROW = "malformed_row"  # not a record: wrong CSV field count or quoting, JSON that is not an object
UNDECODABLE = "undecodable"  # bytes that no accepted encoding decodes (or text holding lone surrogates)
AMBIGUOUS_ENCODING = "ambiguous_encoding"  # not UTF-8; decodes as GB18030 but is not plausibly Chinese text
MISSING_FIELD = "missing_field"  # `id` or `text` absent or null, or `id` blank or invisible-only
WRONG_TYPE = "wrong_type"  # a field of the wrong type, e.g. a numeric id
DUPLICATE_FIELD = "duplicate_field"  # a contract field given twice (repeated JSON key or column name)
INVALID_ID = "invalid_id"  # an id over 1,024 characters or with a run of more than 30 combining marks
RECORD_TOO_LARGE = "record_too_large"  # a record over data.max_record_bytes, rejected before parsing
# bytes or rows that cannot be read (damaged gzip range, damaged Parquet page, over data.max_file_bytes)
UNREADABLE = "unreadable"
EMPTY_TEXT = "empty_text"  # text empty, or only whitespace and invisible characters, after cleaning
EXCESSIVE_COMBINING_MARKS = (
    "excessive_combining_marks"  # a run of more than 30 combining marks (Unicode stream-safe limit)
)
TOO_SHORT = "too_short"  # clean text shorter than data.min_chars
TOO_LONG = "too_long"  # clean text longer than data.max_chars
DUPLICATE_ID = "duplicate_id"  # an earlier clean row of the partition has this id
DUPLICATE_TEXT = "duplicate_text"  # an earlier clean row of the partition has exactly this text

ALL_REASONS = (
    MALFORMED_JSON,
    MALFORMED_ROW,
    UNDECODABLE,
    AMBIGUOUS_ENCODING,
    MISSING_FIELD,
    WRONG_TYPE,
    DUPLICATE_FIELD,
    INVALID_ID,
    RECORD_TOO_LARGE,
    UNREADABLE,
    EMPTY_TEXT,
    EXCESSIVE_COMBINING_MARKS,
    TOO_SHORT,
    TOO_LONG,
    DUPLICATE_ID,
    DUPLICATE_TEXT,
)
