"""CSV cases: strict quoting, field counts, repeated columns, headers, multi-line fields, CRLF
and lone CR, per-line encodings, separator controls, the record-size limit, empty cells and
numeric ids.
"""

from __future__ import annotations

from tests.hostile.builders import Case, Lines, case_of, text_of
from tests.hostile.spec import (
    AMBIGUOUS_ENCODING,
    AS_GB18030,
    DUPLICATE_FIELD,
    EMPTY_TEXT,
    MALFORMED_ROW,
    MAX_RECORD_BYTES,
    MISSING_FIELD,
    RECORD_TOO_LARGE,
    UNDECODABLE,
)
from tests.hostile.text_cases import BECOMES


def csv_cases() -> list[Case]:
    out = []

    def csv_file(kind: str, header: bytes = b"id,text", name: str | None = None) -> Lines:
        f = Lines(kind, name, suffix=".csv")
        f.blank(header)
        return f

    kind = "csv_quote_then_tail"
    f = csv_file(kind)
    f.good_rows()
    f.add(f'{kind}-x,"quoted" tail after the quote'.encode(), MALFORMED_ROW)
    f.good_rows()
    out.append(case_of(kind, f))

    kind = "csv_field_count"
    f = csv_file(kind)
    f.good_rows()
    f.add(f"{kind}-x,one field too many,here".encode(), MALFORMED_ROW)
    f.add(f"{kind}-y".encode(), MALFORMED_ROW)
    f.good_rows()
    out.append(case_of(kind, f))

    kind = "csv_repeated_contract_column"
    f = csv_file(kind, b"id,text,id")
    for number in (1, 2, 3):
        f.add(f"{kind}-{number},{text_of(kind, number)},{kind}-{number}".encode(), DUPLICATE_FIELD)
    out.append(case_of(kind, f))

    kind = "csv_repeated_ignored_column"
    f = csv_file(kind, b"id,text,note,note")
    for number in (1, 2):
        text = text_of(kind, number)
        f.add(f"{kind}-{number},{text},a,b".encode(), clean=(f"{kind}-{number}", text))
    out.append(case_of(kind, f))

    kind = "csv_blank_first_lines"
    f = Lines(kind, suffix=".csv")
    f.blank(b"")
    f.blank(b" \t\r")
    f.blank(b"id,text")
    f.good_rows(2)
    out.append(case_of(kind, f))

    kind = "csv_header_only"
    out.append(Case(kind, {f"{kind}.csv": b"id,text\n"}, {}, {}, 0, (), {}))
    kind = "csv_header_only_no_newline"
    out.append(Case(kind, {f"{kind}.csv": b"id,text"}, {}, {}, 0, (), {}))
    kind = "csv_blank_lines_only"
    out.append(Case(kind, {f"{kind}.csv": b"\n\r\n \t \n"}, {}, {}, 0, (), {}))

    kind = "csv_multiline_with_gbk"
    f = csv_file(kind)
    f.add(
        f'{kind}-1,"first line\nsecond line\nthird line of one field, {kind}"'.encode(),
        clean=(f"{kind}-1", f"first line\nsecond line\nthird line of one field, {kind}"),
    )
    f.add(
        f"{kind}-2,数据清洗的中文文本内容 {kind}".encode("gbk"),
        clean=(f"{kind}-2", f"数据清洗的中文文本内容 {kind}"),
        unit=AS_GB18030,
    )
    f.add(
        f'{kind}-3,"UTF-8 第一行文本\n'.encode() + f'第二行中文内容 {kind}"'.encode("gbk"),
        clean=(f"{kind}-3", f"UTF-8 第一行文本\n第二行中文内容 {kind}"),
    )
    f.good_rows()
    out.append(case_of(kind, f, note="each physical line decoded on its own, then the quoted field spans them"))

    kind = "csv_crlf"
    f = Lines(kind, suffix=".csv")
    f.blank(b"id,text\r")
    for number in (1, 2):
        text = text_of(kind, number)
        f.add(f"{kind}-{number},{text}\r".encode(), clean=(f"{kind}-{number}", text))
    f.blank(b"\r")
    f.add(f'{kind}-3,"quoted, with a comma"\r'.encode(), clean=(f"{kind}-3", "quoted, with a comma"))
    out.append(case_of(kind, f))

    kind = "csv_bom_spaced_header"
    f = Lines(kind, suffix=".csv")
    f.blank(b"\xef\xbb\xbf id , text ,source")
    f.good_rows(2)
    f.lines[1] += b",web"
    f.lines[2] += b","
    out.append(case_of(kind, f))

    kind = "csv_line_encodings"
    f = csv_file(kind)
    f.good_rows()
    f.add(
        f"{kind}-gbk,中文数据清洗测试文本 {kind}".encode("gbk"),
        clean=(f"{kind}-gbk", f"中文数据清洗测试文本 {kind}"),
        unit=AS_GB18030,
    )
    f.add(f"{kind}-latin,Grüezi from Zürich {kind}".encode("latin-1"), AMBIGUOUS_ENCODING, unit=AMBIGUOUS_ENCODING)
    f.add(f"{kind}-junk,".encode() + b"junk \xff\xfe bytes", UNDECODABLE, unit=UNDECODABLE)
    f.good_rows()
    out.append(case_of(kind, f))

    kind = "csv_separator_controls"
    f = csv_file(kind)
    for number, char in enumerate(["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\u2028", "\u2029"], 1):
        f.add(
            f"{kind}-{number},{kind} {number} alpha{char}beta".encode(),
            clean=(f"{kind}-{number}", f"{kind} {number} alpha{BECOMES[char]}beta"),
        )
    f.add(f"{kind}-nul,{kind} alpha\x00beta".encode(), clean=(f"{kind}-nul", f"{kind} alphabeta"))
    out.append(
        case_of(kind, f, note="none of these splits a CSV line (only b'\\n' does); cleaning maps them as in BECOMES")
    )

    kind = "csv_lone_cr"
    f = csv_file(kind)
    f.add(f"{kind}-1,unquoted alpha\rbeta".encode(), MALFORMED_ROW)
    f.add(f'{kind}-2,"{kind} quoted alpha\rbeta"'.encode(), clean=(f"{kind}-2", f"{kind} quoted alpha\nbeta"))
    out.append(case_of(kind, f, note="csv strict mode rejects a CR inside an unquoted field; inside quotes it is text"))

    kind = "csv_quotes_inside"
    f = csv_file(kind)
    f.add(f'{kind}-1,say "hi" now {kind}'.encode(), clean=(f"{kind}-1", f'say "hi" now {kind}'))
    f.add(
        f'{kind}-2,"He said ""hi"", then left, {kind}"'.encode(),
        clean=(f"{kind}-2", f'He said "hi", then left, {kind}'),
    )
    out.append(case_of(kind, f))

    kind = "csv_unterminated_quote"
    f = csv_file(kind)
    f.good_rows(2)
    f.add(f'{kind}-x,"an opening quote\nthat never closes\nbefore the end'.encode(), MALFORMED_ROW)
    out.append(case_of(kind, f, note="an unclosed quote consumes every line to the end of the file: one malformed_row"))

    kind = "csv_record_size_limit"
    f = csv_file(kind)
    f.good_rows()
    f.add(f'{kind}-big,"'.encode() + (b"q" * 1000 + b"\n") * 1100 + b'end"', RECORD_TOO_LARGE)
    f.good_rows()
    f.add(f"{kind}-long,".encode() + b"r" * (MAX_RECORD_BYTES + 4096), RECORD_TOO_LARGE)
    f.good_rows()
    out.append(
        case_of(
            kind, f, note="a quoted record over the limit is skipped to its closing quote; parsing resumes after it"
        )
    )

    kind = "csv_missing_text_column"
    f = csv_file(kind, b"id,body")
    for number in (1, 2):
        f.add(f"{kind}-{number},{text_of(kind, number)}".encode(), MISSING_FIELD)
    out.append(case_of(kind, f))

    kind = "csv_empty_cells"
    f = csv_file(kind, b"id,text,source")
    f.add(f",{text_of(kind, 1)},web".encode(), MISSING_FIELD)
    f.add(f"{kind}-2,,web".encode(), EMPTY_TEXT)
    f.add(f'{kind}-3,"   ",web'.encode(), EMPTY_TEXT)
    f.add(f"{kind}-4,{text_of(kind, 4)},".encode(), clean=(f"{kind}-4", text_of(kind, 4)))
    out.append(case_of(kind, f))

    kind = "csv_numeric_id"
    f = csv_file(kind)
    f.add(f"900100200,{text_of(kind, 1)}".encode(), clean=("900100200", text_of(kind, 1)))
    f.add(f"0900100200,{text_of(kind, 2)}".encode(), clean=("0900100200", text_of(kind, 2)))
    out.append(case_of(kind, f, note="CSV cells are strings: a numeric-looking id is a string id, leading zero kept"))
    return out
