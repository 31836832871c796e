"""clean_documents: the data contract, cleaning and quarantine for one day, streamed.

Records flow through in batches of `data.batch_rows` rows and `data.batch_bytes` bytes:
read (readers.py) -> validate (contract.py) -> clean (cleaning.py) -> length bounds ->
de-duplication -> clean.parquet or quarantine.parquet. Memory stays bounded by the batch
plus the sets of ids and text digests seen so far. Every record read is written to exactly
one of the two files, and each landed file's records are counted a second way, without the
parsers (record_count.py), so that the blocking check can catch a reader that loses rows.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import pyarrow as pa

from aieng_core import asset_keys
from aieng_core.config import AiengConfig, DataConfig
from aieng_core.data import reasons
from aieng_core.data.cleaning import ExcessiveCombiningMarks, clean_text, is_blank
from aieng_core.data.contract import validate_batch
from aieng_core.data.empty_day import has_no_data
from aieng_core.data.raw_documents import KIND as RAW_KIND
from aieng_core.data.raw_documents import snapshot_files
from aieng_core.data.readers import LandedFile, RawRecord, ReadLimits
from aieng_core.data.tables import (
    CLEAN_FILE,
    CLEAN_SCHEMA,
    QUARANTINE_FILE,
    QUARANTINE_SCHEMA,
    num_rows,
    parquet_writer,
)
from aieng_core.faults import crash_point
from aieng_core.hashing import ColumnHasher, sha256_json
from aieng_core.progress import Progress
from aieng_core.store import Artifact, ArtifactSpec, ArtifactStore, Produced, RunInfo

KIND = asset_keys.CLEAN_DOCUMENTS
CODE_VERSION = "clean_documents-v3"  # v3: a .gz file of zero bytes alone is one unreadable record
# Text over this many times max_chars is too_long before any cleaning or Unicode work, which
# bounds the cost of NFC. The margin leaves room for what cleaning removes (NFC composes at
# most 4 code points into 1; collapsed whitespace and control characters); text that needs
# more than a 4x reduction to fit is junk for training anyway.
NFC_MAX_SHRINK = 4

log = logging.getLogger("aieng.data")


def _record_bytes(record: RawRecord) -> int:
    """What a record holds in memory, roughly: its raw bytes and its text (a Parquet record's
    raw is only a preview, so its text must be counted on its own)."""
    text = record.fields.get("text") if record.fields else None
    return len(record.raw) + (len(text) if isinstance(text, str) else 0)


def _batches(records: Iterable[RawRecord], rows: int, max_bytes: int) -> Iterator[list[RawRecord]]:
    """Batches of at most `rows` records and (beyond the first record) `max_bytes` bytes."""
    batch: list[RawRecord] = []
    size = 0
    for record in records:
        record_bytes = _record_bytes(record)
        if batch and (len(batch) >= rows or size + record_bytes > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(record)
        size += record_bytes
    if batch:
        yield batch


def _unencodable_metadata(document: dict[str, Any]) -> str | None:
    """The first field other than text that is not valid Unicode, or None. (A JSON escape
    such as "\\ud800" decodes to a lone surrogate, which no UTF-8 writer accepts; the text
    itself is checked when it is encoded for de-duplication.)"""
    for name in ("id", "source", "lang", "created_at"):
        value = document.get(name)
        if value is not None and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return name
    return None


class PartitionCleaner:
    """Turns batches of raw records into clean and quarantined rows for one partition.

    Stateful only for de-duplication: ids and text digests of the clean rows so far.
    """

    def __init__(self, config: DataConfig, validate: Callable[[list[dict[str, Any]]], list] = validate_batch) -> None:
        self.config = config
        self.validate = validate  # the contract check; swappable so a benchmark can compare approaches
        self.seen_ids: set[str] = set()
        self.seen_texts: set[bytes] = set()
        self.counts: Counter[str] = Counter()
        self.rows_in = 0
        self.rows_clean = 0
        self.chars_clean = 0

    def process(self, batch: list[RawRecord]) -> tuple[dict[str, list], dict[str, list]]:
        clean: dict[str, list] = {name: [] for name in CLEAN_SCHEMA.names}
        quarantine: dict[str, list] = {name: [] for name in QUARANTINE_SCHEMA.names}

        def reject(record: RawRecord, reason: str, detail: str) -> None:
            self.counts[reason] += 1
            quarantine["source_file"].append(record.source_file)
            quarantine["line"].append(record.line)
            quarantine["reason"].append(reason)
            quarantine["detail"].append(detail)
            quarantine["raw"].append(record.raw)

        self.rows_in += len(batch)
        # A record without a reason always has its fields (RawRecord's invariant).
        results = iter(
            self.validate([cast(dict[str, Any], record.fields) for record in batch if record.reason is None])
        )
        for record in batch:
            if record.reason is not None:
                reject(record, record.reason, record.detail or "")
                continue
            result = next(results)
            if isinstance(result, tuple):
                reject(record, *result)
                continue
            if (unencodable := _unencodable_metadata(result)) is not None:
                reject(record, reasons.UNDECODABLE, f"{unencodable} holds a lone surrogate, not valid Unicode")
                continue
            if len(result["text"]) > NFC_MAX_SHRINK * self.config.max_chars:
                # Rejected before any Unicode work: nothing can bring it within max_chars.
                reject(
                    record,
                    reasons.TOO_LONG,
                    f"{len(result['text'])} characters before cleaning, over {NFC_MAX_SHRINK} x max_chars "
                    f"({self.config.max_chars})",
                )
                continue
            try:
                text = clean_text(result["text"])
            except ExcessiveCombiningMarks as exc:
                reject(record, reasons.EXCESSIVE_COMBINING_MARKS, str(exc))
                continue
            if not text or is_blank(text):
                reject(
                    record,
                    reasons.EMPTY_TEXT,
                    "text is empty, or only whitespace and invisible characters, after cleaning",
                )
                continue
            length = len(text)
            if length < self.config.min_chars:
                reject(
                    record, reasons.TOO_SHORT, f"{length} characters after cleaning, minimum is {self.config.min_chars}"
                )
                continue
            if length > self.config.max_chars:
                reject(
                    record, reasons.TOO_LONG, f"{length} characters after cleaning, maximum is {self.config.max_chars}"
                )
                continue
            doc_id = result["id"]
            if doc_id in self.seen_ids:
                reject(record, reasons.DUPLICATE_ID, f"id {doc_id!r} already has a clean row in this partition")
                continue
            try:
                encoded = text.encode("utf-8")
            except UnicodeEncodeError:
                reject(record, reasons.UNDECODABLE, "text holds a lone surrogate, not valid Unicode")
                continue
            digest = hashlib.blake2b(encoded, digest_size=16).digest()
            if digest in self.seen_texts:
                reject(record, reasons.DUPLICATE_TEXT, "exact duplicate of an earlier clean text in this partition")
                continue
            self.seen_ids.add(doc_id)
            self.seen_texts.add(digest)
            self.rows_clean += 1
            self.chars_clean += length
            clean["id"].append(doc_id)
            clean["text"].append(text)
            clean["source"].append(result.get("source"))
            clean["lang"].append(result.get("lang"))
            clean["created_at"].append(result.get("created_at"))
            clean["source_file"].append(record.source_file)
            clean["line"].append(record.line)
        return clean, quarantine

    def metrics(self) -> dict[str, Any]:
        rows_quarantined = sum(self.counts.values())
        return {
            "rows_in": self.rows_in,
            "rows_clean": self.rows_clean,
            "rows_quarantined": rows_quarantined,
            "reasons": {reason: self.counts.get(reason, 0) for reason in reasons.ALL_REASONS},
            "chars_clean": self.chars_clean,
        }


def clean_partition(
    files: list[tuple[str, Path]], config: DataConfig, out_dir: Path, logger: Any = log, label: str = KIND
) -> Produced:
    """Stream `files` (name, path) through the cleaner into out_dir/{clean,quarantine}.parquet."""
    cleaner = PartitionCleaner(config)
    limits = ReadLimits.from_config(config)
    # Provenance columns stay out of the content hash: renaming a landed file changes no data.
    clean_hash = ColumnHasher(["id", "text", "source", "lang", "created_at"])
    quarantine_hash = ColumnHasher(["source_file", "line", "reason", "raw"])
    progress = Progress(logger, label)
    tallies: list[dict[str, Any]] = []

    def records() -> Iterator[RawRecord]:
        for name, path in files:
            landed = LandedFile(path, name, limits)
            yield from landed.records()
            tally = {"name": name, **landed.tally()}
            if tally["expected"] != tally["read"]:
                logger.error(
                    f"{label}: {name}: read {tally['read']} records but the file holds {tally['expected']} "
                    f"({tally['count_source']})"
                )
            tallies.append(tally)

    with (
        parquet_writer(out_dir / CLEAN_FILE, CLEAN_SCHEMA) as clean_out,
        parquet_writer(out_dir / QUARANTINE_FILE, QUARANTINE_SCHEMA) as quarantine_out,
    ):
        for batch in _batches(records(), config.batch_rows, config.batch_bytes):
            clean, quarantine = cleaner.process(batch)
            if clean["id"]:
                clean_batch = pa.RecordBatch.from_pydict(clean, schema=CLEAN_SCHEMA)
                clean_hash.update(clean_batch)
                clean_out.write_batch(clean_batch)
            if quarantine["line"]:
                quarantine_batch = pa.RecordBatch.from_pydict(quarantine, schema=QUARANTINE_SCHEMA)
                quarantine_hash.update(quarantine_batch)
                quarantine_out.write_batch(quarantine_batch)
            crash_point("clean_documents.batch_written")
            progress.update(f"{cleaner.rows_in} rows read, {cleaner.rows_clean} clean")
    metrics = {**cleaner.metrics(), "rows_expected": sum(t["expected"] for t in tallies), "files": tallies}
    progress.update(
        f"{metrics['rows_in']} rows: {metrics['rows_clean']} clean, {metrics['rows_quarantined']} quarantined",
        force=True,
    )
    return Produced(
        content_sha256=sha256_json({"clean": clean_hash.hexdigest(), "quarantine": quarantine_hash.hexdigest()}),
        metrics=metrics,
    )


def build_clean_documents(
    store: ArtifactStore, config: AiengConfig, partition: str, run: RunInfo = RunInfo(), logger: Any = log
) -> Artifact:
    raw = store.require_current(RAW_KIND, partition)
    spec = ArtifactSpec(
        kind=KIND,
        code_version=CODE_VERSION,
        config_sha256=config.section_sha256("data"),
        config_sections=config.section_values("data"),
        partition=partition,
        inputs=((RAW_KIND, raw.id),),
    )

    def produce(staging: Path) -> Produced:
        produced = clean_partition(
            snapshot_files(store.check_input(raw)), config.data, staging, logger, f"{KIND} {partition}"
        )
        # An empty day stays visibly empty downstream (zero rows, not a failed read).
        return Produced(produced.content_sha256, {**produced.metrics, "no_data": has_no_data(raw)}, produced.extra)

    return store.build(spec, produce, run, logger)


def row_accounting(artifact: Artifact) -> dict[str, Any]:
    """Compares three counts that come from different places: the records each landed file
    holds (counted without the parsers), the records the readers produced, and the rows
    actually written (from the Parquet footers, not the manifest's own claims)."""
    metrics = artifact.metrics
    rows_in = metrics["rows_in"]
    rows_expected = metrics.get("rows_expected")
    rows_clean = num_rows(artifact.file(CLEAN_FILE))
    rows_quarantined = num_rows(artifact.file(QUARANTINE_FILE))
    files_off = [f for f in metrics.get("files", []) if f["expected"] != f["read"]]
    problems = [
        f"{f['name']}: read {f['read']} records, the file holds {f['expected']} ({f['count_source']})"
        for f in files_off
    ]
    if rows_expected is None:
        problems.append("no independent record count in the manifest (built by an older code version)")
    elif rows_expected != rows_clean + rows_quarantined:
        problems.append(
            f"{rows_expected} records landed but {rows_clean} clean + {rows_quarantined} quarantined were written"
        )
    if rows_in != rows_clean + rows_quarantined:
        problems.append(f"{rows_in} records read but {rows_clean} clean + {rows_quarantined} quarantined were written")
    return {
        "passed": not problems,
        "rows_expected": rows_expected,
        "rows_in": rows_in,
        "rows_clean": rows_clean,
        "rows_quarantined": rows_quarantined,
        "problems": problems,
    }
