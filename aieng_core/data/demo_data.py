"""Sample raw data for the demo: a few days of real text, landed the way real data lands.

Why it is built this way:
- Real text, offline, reproducible. The corpus is Python's own documentation: the pydoc
  topics (`pydoc_data.topics`, ~465 KB of prose about the language) and the docstrings of a
  fixed, sorted list of standard-library modules. It needs no network and no download, is
  English prose with code, and is big enough (~1.3 MB) to train a small BPE tokenizer and a
  small LM. Everything is iterated in sorted order, so for a given Python version every call
  writes byte-identical files (gzip with mtime 0), and the data version never drifts.
- Messy on purpose. Each day uses a different file format (JSONL, CSV, Parquet, cycling),
  day 2 adds a GBK-encoded CSV, day 1 hides one GBK line inside a UTF-8 JSONL file, a couple
  of texts carry control characters and runs of whitespace, and every day plants a few rows
  that the data contract must quarantine. EXPECTED_DIRTY says exactly which, so tests can
  assert that every planted row, and nothing else, ends in quarantine.
- Safe to land. Files appear atomically (temp file starting with '.', fsync, rename), and a
  day folder that already holds files is never clobbered unless overwrite=True.

Day k (0-based) holds the same bytes whatever `days` is. Days 1-3 share the corpus in three
balanced slices; later days take small slices of a reserved tail of the corpus (cycling when
it runs out) and plant the dirty rows of the format they cycle to: EXPECTED_DIRTY[f"day{k % 3 + 1}"].
"""

from __future__ import annotations

import ast
import csv
import datetime as dt
import gzip
import importlib.util
import io
import json
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from aieng_core.data.cleaning import clean_text
from aieng_core.store.atomic import atomic_write_bytes

# Pure-python or always-built modules with no import side effects; sorted, never changed
# casually: editing this list changes the demo data and so every downstream data version.
STDLIB_MODULES = tuple(
    sorted(
        """
    abc argparse array ast asyncio base64 bisect bz2 calendar cmd codecs collections
    colorsys concurrent.futures configparser contextlib contextvars copy csv dataclasses
    datetime decimal difflib dis doctest email.message email.utils enum filecmp fnmatch
    fractions functools getopt gettext glob graphlib gzip hashlib heapq hmac html.parser
    http.client imaplib inspect io ipaddress itertools json linecache logging lzma math
    mimetypes numbers operator optparse pathlib pprint queue random re reprlib sched
    secrets selectors shlex shutil smtplib socket sqlite3 statistics string struct
    subprocess tarfile tempfile textwrap threading time timeit tokenize traceback types
    typing unittest urllib.parse uuid warnings weakref xml.dom.minidom
    xml.etree.ElementTree zipfile zlib
""".split()
    )
)
MIN_DOC_CHARS = 40  # shorter docstrings are skipped (well above any config's min_chars)
CORPUS_DAYS = 3  # the corpus is shared by days 1-3; later days draw from the reserve
RESERVE_DOCS = 200  # tail of the corpus kept back for days beyond the third
EXTRA_DAY_DOCS = 25  # real documents on each day beyond the third
FORMATS = ("jsonl", "csv", "parquet")
COLUMNS = ("id", "text", "source", "lang", "created_at")

# Planted rows and the quarantine reason each must get (reasons not listed: zero).
# day1 documents.jsonl, inserted after the 10th real document:
#   {"id": "broken-json", "text": "unterminated...      -> malformed_json
#   ["an", "array", ...]                               -> malformed_row (JSON, not an object)
#   {"id": "latin1-bytes", "text": "caf\xe9 ... \xff"}  -> undecodable (neither UTF-8 nor GB18030)
#   {"text": ...} without id                           -> missing_field
#   {"id": "null-text", "text": null}                  -> missing_field
#   {"id": "   ", "text": ...}                         -> missing_field (blank id)
#   {"id": 42, "text": ...}                            -> wrong_type
#   {"id": "list-text", "text": ["not", ...]}          -> wrong_type
#   {"id": "blank-text", "text": " \t\x07 \n "}         -> empty_text
#   {"id": "short-text", "text": "ok."}                -> too_short
#   id of the 1st real document, new text              -> duplicate_id
#   new id, text of the 2nd real document verbatim     -> duplicate_text
#   plus, all clean: one GBK-encoded Chinese line, and the 3rd and 4th real documents
#   carrying control characters and extra whitespace (cleaned, not quarantined).
# day2 documents.csv, appended after the real documents (legacy_gbk.csv is all clean):
#   a row of 2 fields, a row of 6 fields               -> malformed_row x2
#   id ""                                              -> missing_field
#   text "   \t  "                                     -> empty_text
#   text "ok."                                         -> too_short
#   id of the 1st real document, new text              -> duplicate_id
#   new id, text of the 2nd real document verbatim     -> duplicate_text
# day3 documents.parquet, appended after the real documents:
#   id null, text null                                 -> missing_field x2
#   text "  \n\t "                                     -> empty_text
#   text "ok."                                         -> too_short
#   id of the 1st real document, new text              -> duplicate_id
# day3 extra.jsonl.gz, after a few real documents:
#   truncated line -> malformed_json; "a bare string" -> malformed_row; a line with b"\xff"
#   -> undecodable; {"id": 7, ...} -> wrong_type; text of the 2nd document of documents.parquet
#   verbatim -> duplicate_text (de-duplication spans all files of a partition)
EXPECTED_DIRTY: dict[str, dict[str, int]] = {
    "day1": {
        "malformed_json": 1,
        "malformed_row": 1,
        "undecodable": 1,
        "missing_field": 3,
        "wrong_type": 2,
        "empty_text": 1,
        "too_short": 1,
        "duplicate_id": 1,
        "duplicate_text": 1,
    },
    "day2": {
        "malformed_row": 2,
        "missing_field": 1,
        "empty_text": 1,
        "too_short": 1,
        "duplicate_id": 1,
        "duplicate_text": 1,
    },
    "day3": {
        "malformed_json": 1,
        "malformed_row": 1,
        "undecodable": 1,
        "missing_field": 2,
        "wrong_type": 1,
        "empty_text": 1,
        "too_short": 1,
        "duplicate_id": 1,
        "duplicate_text": 1,
    },
}

GBK_JSONL_TEXT = "这一行用GBK编码写进了UTF-8文件，管道逐行解码，把它恢复成正常的中文文本。"
GBK_CSV_TEXTS = (
    "数据管道每天凌晨读取新落地的原始文本，先校验数据契约，再做清洗、去重和隔离。",
    "编码问题是老系统迁移时最常见的坑：同一个目录里既有UTF-8文件，也有GBK文件。",
    "隔离区保存每一条被拒绝的记录和拒绝原因，所以没有任何一行数据会被悄悄丢弃。",
    "每个产物都记录输入的内容哈希，出了事故时能追溯到是哪一天的哪一个文件造成的。",
)


class Doc(NamedTuple):
    id: str
    text: str
    source: str


def _docstrings(module_name: str) -> list[tuple[str, str | None]]:
    """(qualified name, docstring) of a module, its public classes, functions and methods.

    Read from the module's source with `ast`, never from the imported module: attributes a
    running process has patched (pytest replaces threading.excepthook, torch replaces
    inspect.getfile) would otherwise make the corpus depend on who calls us. Modules
    without Python source (C extensions) contribute nothing.
    """
    spec = importlib.util.find_spec(module_name)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return []
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    found = [(module_name, ast.get_docstring(tree))]
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    for node in sorted((n for n in tree.body if isinstance(n, definitions)), key=lambda n: n.name):
        if node.name.startswith("_"):
            continue
        found.append((f"{module_name}.{node.name}", ast.get_docstring(node)))
        if isinstance(node, ast.ClassDef):
            methods = (n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
            for method in sorted(methods, key=lambda n: n.name):
                if not method.name.startswith("_"):
                    found.append((f"{module_name}.{node.name}.{method.name}", ast.get_docstring(method)))
    return found


@lru_cache(maxsize=1)
def corpus() -> tuple[Doc, ...]:
    """The whole demo corpus in a fixed order, texts unique after cleaning."""
    from pydoc_data.topics import topics

    candidates = [(f"pydoc:{name}", topics[name], "pydoc-topics") for name in sorted(topics)]
    for module_name in STDLIB_MODULES:
        candidates += [
            (f"doc:{qualname}", doc, "stdlib-docstrings") for qualname, doc in _docstrings(module_name) if doc
        ]
    docs, seen = [], set()
    for doc_id, text, source in candidates:
        cleaned = clean_text(text)
        if len(cleaned) < MIN_DOC_CHARS or cleaned in seen:
            continue  # inherited docstrings repeat a lot; a repeat would be a duplicate_text
        seen.add(cleaned)
        docs.append(Doc(doc_id, text, source))
    return tuple(docs)


def day_documents(offset: int) -> list[Doc]:
    """The real documents of day `offset` (0-based): the same whatever the number of days."""
    docs = corpus()
    main, reserve = docs[:-RESERVE_DOCS], docs[-RESERVE_DOCS:]
    if offset >= CORPUS_DAYS:
        start = (offset - CORPUS_DAYS) * EXTRA_DAY_DOCS % len(reserve)
        return list((reserve + reserve)[start : start + EXTRA_DAY_DOCS])
    total, bounds, running = sum(len(d.text) for d in main), [0], 0
    for index, doc in enumerate(main):  # cut where the running size passes each third
        running += len(doc.text)
        if len(bounds) < CORPUS_DAYS and running >= total * len(bounds) / CORPUS_DAYS:
            bounds.append(index + 1)
    bounds.append(len(main))
    return list(main[bounds[offset] : bounds[offset + 1]])


def _record(doc: Doc, day: dt.date, lang: str = "en") -> dict[str, Any]:
    return {"id": doc.id, "text": doc.text, "source": doc.source, "lang": lang, "created_at": day.isoformat()}


def _json_line(record: Any) -> bytes:
    return json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n"


def _jsonl_day(docs: list[Doc], day: dt.date) -> dict[str, bytes]:
    rows = [_record(doc, day) for doc in docs]
    for index, noise in ((2, "\x00"), (3, "\x0b\x1b")):  # control chars + whitespace, cleaned away
        text = rows[index]["text"]
        rows[index]["text"] = "\t  " + text.replace(" ", f"   {noise}\t", 3) + "  \x7f\n\n\n\n"
    lines = [_json_line(row) for row in rows]
    meta = {"source": "demo-dirty", "lang": "en", "created_at": day.isoformat()}
    gbk = {
        "id": "gbk-line",
        "text": GBK_JSONL_TEXT,
        "source": "legacy-gbk",
        "lang": "zh",
        "created_at": day.isoformat(),
    }
    dirty = [
        b'{"id": "broken-json", "text": "this line was cut off in the middle of a wri\n',  # malformed_json
        _json_line(["an", "array", "is", "valid", "JSON", "but", "not", "a", "record"]),  # malformed_row
        b'{"id": "latin1-bytes", "text": "caf\xe9 cr\xe8me written as Latin-1 \xff\xfe, not UTF-8"}\n',  # undecodable
        _json_line({"text": "A record that forgot its identifier entirely.", **meta}),  # missing_field
        _json_line({"id": "null-text", "text": None, **meta}),  # missing_field
        _json_line({"id": "   ", "text": "A record whose identifier is only spaces.", **meta}),  # missing_field
        _json_line({"id": 42, "text": "A record whose identifier is a number, not a string.", **meta}),  # wrong_type
        _json_line({"id": "list-text", "text": ["not", "a", "string", "but", "a", "list"], **meta}),  # wrong_type
        _json_line({"id": "blank-text", "text": " \t\x07 \n ", **meta}),  # empty_text
        _json_line({"id": "short-text", "text": "ok.", **meta}),  # too_short
        _json_line(
            {"id": docs[0].id, "text": "A different text that reuses the id of the first document.", **meta}
        ),  # duplicate_id
        _json_line({"id": "copied-text", "text": docs[1].text, **meta}),  # duplicate_text
    ]
    lines[5:5] = [json.dumps(gbk, ensure_ascii=False).encode("gbk") + b"\n"]
    lines[11:11] = dirty
    return {"documents.jsonl": b"".join(lines)}


def _csv_bytes(rows: list[list[str]], encoding: str) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows(rows)
    return out.getvalue().encode(encoding)


def _csv_day(docs: list[Doc], day: dt.date) -> dict[str, bytes]:
    date = day.isoformat()
    rows = [[doc.id, doc.text, doc.source, "en", date] for doc in docs]
    rows += [
        ["too-few-fields", "A row with two fields only."],  # malformed_row
        ["too-many-fields", "A row with one field too many.", "demo-dirty", "en", date, "surplus"],  # malformed_row
        ["", "A row whose identifier cell is empty.", "demo-dirty", "en", date],  # missing_field
        ["blank-text", "   \t  ", "demo-dirty", "en", date],  # empty_text
        ["short-text", "ok.", "demo-dirty", "en", date],  # too_short
        [
            docs[0].id,
            "Another text that reuses the id of the first document.",
            "demo-dirty",
            "en",
            date,
        ],  # duplicate_id
        ["copied-text", docs[1].text, "demo-dirty", "en", date],  # duplicate_text
    ]
    legacy = [[f"legacy-gbk-{n}", text, "legacy-gbk", "zh", date] for n, text in enumerate(GBK_CSV_TEXTS, 1)]
    return {"documents.csv": _csv_bytes(rows, "utf-8"), "legacy_gbk.csv": _csv_bytes(legacy, "gbk")}


def _parquet_day(docs: list[Doc], day: dt.date) -> dict[str, bytes]:
    extra_docs, docs = docs[-4:], docs[:-4]
    meta = {"source": "demo-dirty", "lang": "en", "created_at": day.isoformat()}
    rows = [_record(doc, day) for doc in docs] + [
        {"id": None, "text": "A row whose identifier is null.", **meta},  # missing_field
        {"id": "null-text", "text": None, **meta},  # missing_field
        {"id": "blank-text", "text": "  \n\t ", **meta},  # empty_text
        {"id": "short-text", "text": "ok.", **meta},  # too_short
        {
            "id": docs[0].id,
            "text": "Yet another text that reuses the id of the first document.",
            **meta,
        },  # duplicate_id
    ]
    table = pa.Table.from_pylist(rows, schema=pa.schema([(name, pa.string()) for name in COLUMNS]))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    extra = [_json_line(_record(doc, day)) for doc in extra_docs] + [
        b'{"id": "broken-json", "text": "cut off\n',  # malformed_json
        _json_line("a bare string is valid JSON but not a record"),  # malformed_row
        b'{"id": "bad-bytes", "text": "\xff\xff invalid in every encoding"}\n',  # undecodable
        _json_line({"id": 7, "text": "A record whose identifier is a number.", **meta}),  # wrong_type
        _json_line({"id": "copied-text", "text": docs[1].text, **meta}),  # duplicate_text
    ]
    return {
        "documents.parquet": sink.getvalue().to_pybytes(),
        "extra.jsonl.gz": gzip.compress(b"".join(extra), mtime=0),
    }


BUILDERS = {"jsonl": _jsonl_day, "csv": _csv_day, "parquet": _parquet_day}


def land_demo_data(
    home: Path, start_date: dt.date = dt.date(2026, 1, 1), days: int = 3, overwrite: bool = False
) -> list[Path]:
    """Land `days` days of sample raw data in home/raw/YYYY-MM-DD/; return the files written, sorted.

    Raises FileExistsError, before writing anything, if a day folder already holds files and
    overwrite is False. With overwrite=True the demo files are replaced (each atomically).
    """
    if days < 1:
        raise ValueError(f"days must be at least 1, got {days}")
    folders = [Path(home) / "raw" / (start_date + dt.timedelta(days=k)).isoformat() for k in range(days)]
    if not overwrite:
        for folder in folders:
            if folder.is_dir() and any(folder.iterdir()):
                raise FileExistsError(
                    f"{folder} already holds files; refusing to overwrite landed data (pass overwrite=True)"
                )
    written = []
    for offset, folder in enumerate(folders):
        day = start_date + dt.timedelta(days=offset)
        files = BUILDERS[FORMATS[offset % len(FORMATS)]](day_documents(offset), day)
        for name, data in sorted(files.items()):
            atomic_write_bytes(folder / name, data)
            written.append(folder / name)
    return sorted(written)
