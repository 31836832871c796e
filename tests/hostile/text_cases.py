"""Text cases: what cleaning and the contract make of a record's text and id: separators and
line breaks, invisible and control characters, special-token literals, lone surrogates,
normalization, combining-mark runs, length and id limits, duplicates, contract types.
"""

from __future__ import annotations

from tests.hostile.builders import Case, Lines, case_of, text_of
from tests.hostile.spec import (
    DUPLICATE_ID,
    DUPLICATE_TEXT,
    EMPTY_TEXT,
    EXCESSIVE_COMBINING_MARKS,
    INVALID_ID,
    MALFORMED_JSON,
    MAX_CHARS,
    MAX_ID_CHARS,
    MISSING_FIELD,
    STREAM_SAFE_MARKS,
    TOO_LONG,
    TOO_SHORT,
    UNDECODABLE,
    WRONG_TYPE,
)

# What cleaning makes of each line-breaking or separating control character (the documented
# rule of aieng_core/data/cleaning.py: line breaks become "\n", the separators a space).
BECOMES = {
    "\r": "\n",
    "\x0b": "\n",
    "\x0c": "\n",
    "\x85": "\n",
    "\u2028": "\n",
    "\u2029": "\n",
    "\x1c": " ",
    "\x1d": " ",
    "\x1e": " ",
    "\x1f": " ",
}
SEPARATOR_KINDS = {
    "ws_lone_cr": "\r",
    "ws_vertical_tab": "\x0b",
    "ws_form_feed": "\x0c",
    "ws_file_sep": "\x1c",
    "ws_group_sep": "\x1d",
    "ws_record_sep": "\x1e",
    "ws_unit_sep": "\x1f",
    "ws_nel": "\x85",
    "ws_line_sep": "\u2028",
    "ws_para_sep": "\u2029",
}


def text_cases() -> list[Case]:
    out = []
    kind = "special_tokens_literal"
    f = Lines(kind)
    for number, text in enumerate(
        [
            f"A document that mentions <|endoftext|> in the middle, {kind}.",
            f"<|pad|><|pad|> padding tokens written as text, {kind}",
            f"<|endoftext|> {kind} <|pad|>",
        ],
        1,
    ):
        f.record({"id": f"{kind}-{number}", "text": text})
    out.append(case_of(kind, f))

    # Line-breaking and separating controls between two words: they separate, never glue.
    for kind, char in SEPARATOR_KINDS.items():
        f = Lines(kind)
        f.record(
            {"id": f"{kind}-1", "text": f"{kind} alpha{char}beta words"},
            clean_text=f"{kind} alpha{BECOMES[char]}beta words",
        )
        second = f"{kind}{char}{char}second{char} \t{char}record here"
        if BECOMES[char] == "\n":  # two breaks (with only whitespace between) are one paragraph break
            f.record({"id": f"{kind}-2", "text": second}, clean_text=f"{kind}\n\nsecond\n\nrecord here")
        else:
            f.record({"id": f"{kind}-2", "text": second}, clean_text=f"{kind} second record here")
        out.append(
            case_of(kind, f, note="line breaks become \\n, the \\x1c-\\x1f separators a space: words never glue")
        )

    kind = "ws_crlf_in_text"
    f = Lines(kind)
    f.record({"id": f"{kind}-1", "text": f"{kind} crlf\r\nbreak here"}, clean_text=f"{kind} crlf\nbreak here")
    f.record({"id": f"{kind}-2", "text": f"{kind} mixed\r\n\r\n\r\n\rbreaks"}, clean_text=f"{kind} mixed\n\nbreaks")
    out.append(case_of(kind, f, note="CRLF is one line break; 3+ breaks become a paragraph break"))

    kind = "nul_and_c1_controls"
    f = Lines(kind)
    f.record({"id": f"{kind}-1", "text": f"{kind} alpha\u0000beta words"}, clean_text=f"{kind} alphabeta words")
    f.record({"id": f"{kind}-2", "text": f"{kind} gamma\u0080\u009fdelta words"}, clean_text=f"{kind} gammadelta words")
    out.append(case_of(kind, f, note="controls that are not whitespace are removed"))

    kind = "raw_control_in_json_string"
    f = Lines(kind)
    f.good()
    f.add(b'{"id": "raw_control_in_json_string-x", "text": "a raw \x01 byte inside a JSON string"}', MALFORMED_JSON)
    f.add(b'{"id": "raw_control_in_json_string-y", "text": "a raw \t tab inside a JSON string"}', MALFORMED_JSON)
    f.good()
    out.append(case_of(kind, f, note="raw control characters are invalid inside JSON strings: json.loads fails"))

    kind = "invisible_ids"
    f = Lines(kind)
    for number, doc_id in enumerate(["\u200b", "\ufeff", "\x1c", "\u200b\ufeff\x1c"], 1):
        f.record({"id": doc_id, "text": text_of(kind, number)}, MISSING_FIELD)
    f.good()
    out.append(case_of(kind, f))

    kind = "invisible_texts"
    f = Lines(kind)
    for number, text in enumerate(["\u200b", "\ufeff", "\x1c", " \u200b\ufeff\x1c "], 1):
        f.record({"id": f"{kind}-{number}", "text": text}, EMPTY_TEXT)
    f.good()
    out.append(case_of(kind, f))

    kind = "nfc_nfd_ids"
    f = Lines(kind)
    f.record({"id": f"{kind}-caf\u00e9", "text": text_of(kind, 1)})
    f.record({"id": f"{kind}-cafe\u0301", "text": text_of(kind, 2)}, DUPLICATE_ID)
    out.append(case_of(kind, f, note="ids compare after NFC: the NFD spelling of the same id is a duplicate"))

    kind = "nfd_text_normalized"
    f = Lines(kind)
    f.record({"id": f"{kind}-1", "text": f"{kind}: cafe\u0301 and A\u030a"}, clean_text=f"{kind}: caf\u00e9 and \u00c5")
    f.record({"id": f"{kind}-2", "text": f"{kind}: caf\u00e9 and \u00c5"}, DUPLICATE_TEXT)
    out.append(case_of(kind, f, note="texts are compared after cleaning (NFC), so the NFC copy is a duplicate"))

    kind = "lone_surrogates"
    f = Lines(kind)
    f.add(b'{"id": "lone_surrogates-1", "text": "a lone high \\ud800 surrogate escape"}', UNDECODABLE)
    f.add(b'{"id": "lone_surrogates-2", "text": "a lone low \\udc00 surrogate escape"}', UNDECODABLE)
    f.add(b'{"id": "lone_surrogates-\\ud800", "text": "the id holds a lone surrogate escape"}', UNDECODABLE)
    f.add(
        b'{"id": "lone_surrogates-4", "text": "a paired escape \\ud83d\\ude00 is an emoji"}',
        clean=("lone_surrogates-4", "a paired escape \U0001f600 is an emoji"),
    )
    out.append(case_of(kind, f))

    kind = "combining_marks_160k"
    f = Lines(kind)
    f.record({"id": f"{kind}-marks", "text": f"{kind} x" + "\u0301" * 160_000}, EXCESSIVE_COMBINING_MARKS)
    f.good()
    out.append(case_of(kind, f))

    kind = "combining_marks_alternating"
    f = Lines(kind)
    # Two mark classes alternating: canonical reordering of this run is quadratic in NFC.
    f.record({"id": f"{kind}-marks", "text": f"{kind} x" + "\u0301\u0323" * 80_000}, EXCESSIVE_COMBINING_MARKS)
    f.good()
    out.append(case_of(kind, f, note="160,000 marks of two classes; NFC of this run takes ~30 s unless refused first"))

    kind = "combining_marks_boundary"
    f = Lines(kind)
    # U+0332 has no precomposed form with x, so NFC leaves the run length unchanged.
    at_limit = f"{kind} x" + "\u0332" * STREAM_SAFE_MARKS + " at the limit"
    f.record({"id": f"{kind}-1", "text": at_limit})
    f.record(
        {"id": f"{kind}-2", "text": f"{kind} x" + "\u0332" * (STREAM_SAFE_MARKS + 1) + " over it"},
        EXCESSIVE_COMBINING_MARKS,
    )
    out.append(case_of(kind, f))

    kind = "length_bounds"
    f = Lines(kind)
    f.record({"id": f"{kind}-1", "text": "lb-9chars"}, TOO_SHORT)  # 9 characters
    f.record({"id": f"{kind}-2", "text": "lb-10chars"})  # 10
    f.record({"id": f"{kind}-3", "text": "  lb  \t 9ch  "}, TOO_SHORT)  # "lb 9ch" after cleaning
    f.record({"id": f"{kind}-4", "text": "L" * (MAX_CHARS - len(kind)) + kind})  # exactly max_chars
    f.record({"id": f"{kind}-5", "text": "M" * (MAX_CHARS + 1 - len(kind)) + kind}, TOO_LONG)
    out.append(case_of(kind, f))

    kind = "id_limits"
    f = Lines(kind)
    f.record({"id": kind + "-" + "i" * (MAX_ID_CHARS - len(kind) - 1), "text": text_of(kind, 1)})  # 1,024 characters
    f.record({"id": kind + "-" + "j" * (MAX_ID_CHARS - len(kind)), "text": text_of(kind, 2)}, INVALID_ID)  # 1,025
    f.record({"id": f"{kind}-x" + "\u0332" * (STREAM_SAFE_MARKS + 1), "text": text_of(kind, 3)}, INVALID_ID)
    f.record({"id": f"{kind}-y" + "\u0332" * STREAM_SAFE_MARKS, "text": text_of(kind, 4)})
    out.append(case_of(kind, f))

    kind = "duplicates_in_file"
    f = Lines(kind)
    f.record({"id": f"{kind}-1", "text": text_of(kind, 1)})
    f.record({"id": f"{kind}-1", "text": text_of(kind, 2)}, DUPLICATE_ID)
    f.record({"id": f"{kind}-3", "text": text_of(kind, 1)}, DUPLICATE_TEXT)
    f.record(
        {"id": f"{kind}-4", "text": "  " + text_of(kind, 1).replace(" ", "  ")}, DUPLICATE_TEXT
    )  # same after cleaning
    out.append(case_of(kind, f))

    kind = "duplicates_across_files"
    first, second = Lines(kind, f"{kind}-a.jsonl"), Lines(kind, f"{kind}-b.csv")
    first.record({"id": f"{kind}-1", "text": text_of(kind, 1)})
    second.blank(b"id,text")
    second.add(f"{kind}-1,{text_of(kind, 2)}".encode(), DUPLICATE_ID)
    second.add(f"{kind}-3,{text_of(kind, 1)}".encode(), DUPLICATE_TEXT)
    out.append(case_of(kind, first, second))

    kind = "contract_types"
    f = Lines(kind)
    f.record({"id": f"{kind}-1"}, MISSING_FIELD)
    f.record({"id": f"{kind}-2", "text": None}, MISSING_FIELD)
    f.record({"text": text_of(kind, 3)}, MISSING_FIELD)
    f.record({"id": 4, "text": text_of(kind, 4)}, WRONG_TYPE)
    f.record({"id": f"{kind}-5", "text": ["a", "list"]}, WRONG_TYPE)
    f.record({"id": f"{kind}-6", "text": text_of(kind, 6), "source": 6}, WRONG_TYPE)
    f.record(
        {
            "id": f"{kind}-7",
            "text": text_of(kind, 7),
            "source": "web",
            "lang": "en",
            "created_at": "2026-01-01T00:00:00Z",
        }
    )
    out.append(case_of(kind, f))
    return out
