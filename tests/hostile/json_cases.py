"""JSON Lines cases: repeated keys, nesting too deep to parse, huge numbers, values that are
not objects, NaN and Infinity, malformed lines, blank and CRLF lines, the record-size limit.
"""

from __future__ import annotations

from tests.hostile.builders import Case, Lines, case_of, dumps, text_of
from tests.hostile.spec import (
    DUPLICATE_FIELD,
    MALFORMED_JSON,
    MALFORMED_ROW,
    MAX_RECORD_BYTES,
    RECORD_TOO_LARGE,
    WRONG_TYPE,
)


def json_cases() -> list[Case]:
    out = []
    kind = "repeated_contract_keys"
    f = Lines(kind)
    f.good()
    k = kind.encode()
    f.add(b'{"id": "' + k + b'-a", "id": "' + k + b'-b", "text": "two ids in one record here"}', DUPLICATE_FIELD)
    f.add(b'{"id": "' + k + b'-c", "text": "the first text here", "text": "the second text here"}', DUPLICATE_FIELD)
    f.add(b'{"id": "' + k + b'-d", "text": "a text with two sources", "source": "a", "source": "b"}', DUPLICATE_FIELD)
    f.add(b'{"id": "' + k + b'-e", "text": "a text with two langs", "lang": "en", "lang": "en"}', DUPLICATE_FIELD)
    f.add(
        b'{"id": "' + k + b'-f", "text": "a text with two times", "created_at": null, "created_at": "2026-01-01"}',
        DUPLICATE_FIELD,
    )
    f.add(
        b'{"id": "' + k + b'-g", "\\u0069d": "' + k + b'-h", "text": "an escaped key spells id again"}', DUPLICATE_FIELD
    )
    out.append(case_of(kind, f, note="a key written with an escape is the same key once decoded"))

    kind = "repeated_ignored_keys"
    f = Lines(kind)
    k = kind.encode()
    f.add(
        b'{"id": "' + k + b'-1", "text": "ignored key twice at top level here", "extra": 1, "extra": 2}',
        clean=(f"{kind}-1", "ignored key twice at top level here"),
    )
    f.add(
        b'{"id": "'
        + k
        + b'-2", "text": "nested repeated contract names here", "meta": {"id": 1, "id": 2, "text": "a", "text": "b"}}',
        clean=(f"{kind}-2", "nested repeated contract names here"),
    )
    f.add(
        b'{"\\u0074ext": "a text under an escaped key here", "id": "' + k + b'-3"}',
        clean=(f"{kind}-3", "a text under an escaped key here"),
    )
    out.append(case_of(kind, f))

    kind = "deep_nesting"
    f = Lines(kind)
    f.good()
    f.add(b"[" * 100_000 + b"]" * 100_000, MALFORMED_JSON)
    f.add(b'{"id": "deep_nesting-open", "text": ' + b"[" * 100_000, MALFORMED_JSON)
    f.good()
    out.append(case_of(kind, f))

    kind = "deep_nesting_ignored_field"
    f = Lines(kind)
    f.add(
        b'{"id": "'
        + kind.encode()
        + b'-1", "text": "deep value in an ignored field", "deep": '
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}",
        MALFORMED_JSON,
    )
    f.add(
        b'{"deep": '
        + b'{"a": ' * 50_000
        + b"0"
        + b"}" * 50_000
        + b', "text": "deep object before the fields", "id": "'
        + kind.encode()
        + b'-2"}',
        MALFORMED_JSON,
    )
    f.add(
        b'{"id": "'
        + kind.encode()
        + b'-3", "text": "a 200-deep value in an ignored field", "deep": '
        + b"[" * 200
        + b"]" * 200
        + b"}",
        clean=(f"{kind}-3", "a 200-deep value in an ignored field"),
    )
    f.good()
    out.append(
        case_of(
            kind,
            f,
            note="too deep to parse is malformed_json even in an ignored field; a parseable depth never matters",
        )
    )

    big = b"9" * 5000
    kind = "huge_number_ignored"
    f = Lines(kind)
    f.add(
        b'{"id": "' + kind.encode() + b'-1", "text": "a 5,000-digit number sits beside me", "n": ' + big + b"}",
        clean=(f"{kind}-1", "a 5,000-digit number sits beside me"),
    )
    f.add(
        b'{"n": -' + big + b'.5e3, "id": "' + kind.encode() + b'-2", "text": "a huge float sits before me here"}',
        clean=(f"{kind}-2", "a huge float sits before me here"),
    )
    out.append(case_of(kind, f))

    kind = "huge_number_contract"
    f = Lines(kind)
    f.add(b'{"id": ' + big + b', "text": "my id is a 5,000-digit number"}', WRONG_TYPE)
    f.add(b'{"id": "' + kind.encode() + b'-2", "text": ' + big + b"}", WRONG_TYPE)
    f.good()
    out.append(
        case_of(kind, f, note="Python's int-string limit (4,300 digits) must not turn these into malformed_json")
    )

    kind = "not_an_object"
    f = Lines(kind)
    for raw in (b'["an", "array"]', b'"a bare string"', b"42", b"null", b"true", b"NaN"):
        f.add(raw, MALFORMED_ROW)
    f.good()
    out.append(case_of(kind, f))

    kind = "nan_and_infinity"
    f = Lines(kind)
    k = kind.encode()
    f.add(
        b'{"id": "' + k + b'-1", "text": "a NaN sits in an ignored field", "score": NaN, "w": -Infinity}',
        clean=(f"{kind}-1", "a NaN sits in an ignored field"),
    )
    f.add(b'{"id": "' + k + b'-2", "text": NaN}', WRONG_TYPE)
    f.add(b'{"id": Infinity, "text": "my id is Infinity, a float"}', WRONG_TYPE)
    out.append(
        case_of(
            kind,
            f,
            note="json.loads accepts NaN/Infinity, so they are numbers: ignored, or wrong_type in a contract field",
        )
    )

    kind = "malformed_json_variety"
    f = Lines(kind)
    f.good()
    k = kind.encode()
    for raw in (
        b'{"id": "' + k + b'-a", "text": "cut off',
        b'{"id": "' + k + b'-b", "text": "trailing comma",}',
        b'{"id": "' + k + b'-c", "text": "two objects"} {"id": "x"}',
        b"{'id': 'single', 'text': 'quotes'}",
        b"\x00",
        "\u3000".encode(),  # not ASCII whitespace: not a blank line
        b"\xc2\xa0 \xc2\xa0",
    ):
        f.add(raw, MALFORMED_JSON)
    f.good()
    out.append(case_of(kind, f, note="blank means ASCII whitespace only; U+3000 and NBSP lines are records"))

    kind = "blank_lines_only"
    out.append(Case(kind, {f"{kind}.jsonl": b"\n \n\t\r\n\x0b\x0c\n\r\n   \n"}, {}, {}, 0, (), {}))

    kind = "blank_and_crlf_lines"
    f = Lines(kind)
    f.blank(b"")
    f.add(dumps({"id": f"{kind}-1", "text": text_of(kind, 1)}) + b"\r", clean=(f"{kind}-1", text_of(kind, 1)))
    f.blank(b" \t\x0b\x0c\r")
    f.add(b"  " + dumps({"id": f"{kind}-2", "text": text_of(kind, 2)}) + b" \t", clean=(f"{kind}-2", text_of(kind, 2)))
    f.add(dumps({"id": f"{kind}-3", "text": text_of(kind, 3)}), clean=(f"{kind}-3", text_of(kind, 3)))
    out.append(case_of(kind, f, final_newline=False, note="the last record has no final newline"))

    kind = "record_size_limit"
    f = Lines(kind)
    f.good()
    over = MAX_RECORD_BYTES + 4096
    head = b'{"id": "' + kind.encode() + b'-big", "text": "'
    f.add(head + b"o" * (over - len(head) - 2) + b'"}', RECORD_TOO_LARGE)
    under = MAX_RECORD_BYTES - 8192
    head = b'{"id": "' + kind.encode() + b'-ok", "text": "fits under the record limit", "pad": "'
    f.add(head + b"p" * (under - len(head) - 2) + b'"}', clean=(f"{kind}-ok", "fits under the record limit"))
    f.good()
    out.append(
        case_of(
            kind, f, note="lines 4 KiB over and 8 KiB under the limit, so whether the newline counts does not matter"
        )
    )
    return out
