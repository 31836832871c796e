"""The data-quality report of one partition: what came in, what came out clean, and why
the rest was quarantined."""

from __future__ import annotations

from collections import Counter
from typing import Any

from aieng_core import asset_keys
from aieng_core.data.tables import QUARANTINE_FILE, iter_batches
from aieng_core.home import parse_partition
from aieng_core.store import Artifact, ArtifactStore

CLEAN_KIND = asset_keys.CLEAN_DOCUMENTS


def partition_report(store: ArtifactStore, partition: str) -> dict[str, Any]:
    parse_partition(partition)
    artifact = store.require_current(CLEAN_KIND, partition)
    metrics = artifact.metrics
    return {
        "partition": partition,
        "artifact_id": artifact.id,
        "rows_expected": metrics.get("rows_expected"),
        "rows_in": metrics["rows_in"],
        "rows_clean": metrics["rows_clean"],
        "rows_quarantined": metrics["rows_quarantined"],
        "reasons": dict(metrics["reasons"]),
        "quarantine_path": str(artifact.file(QUARANTINE_FILE)),
    }


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"partition {report['partition']} (clean_documents {report['artifact_id']})",
        f"  rows landed       {report['rows_expected'] if report['rows_expected'] is not None else '?':>9}  "
        "(counted without the parsers)",
        f"  rows in           {report['rows_in']:>9}",
        f"  rows clean        {report['rows_clean']:>9}",
        f"  rows quarantined  {report['rows_quarantined']:>9}",
    ]
    for reason, count in sorted(report["reasons"].items(), key=lambda item: (-item[1], item[0])):
        if not count:
            continue
        lines.append(f"    {reason:<16}{count:>9}")
    lines.append(f"  quarantine        {report['quarantine_path']}")
    return "\n".join(lines)


def quarantine_samples(artifact: Artifact, per_reason: int = 2, scan_rows: int = 10_000) -> list[dict[str, Any]]:
    """Up to `per_reason` quarantined rows of each reason, from the first `scan_rows` rows."""
    samples: list[dict[str, Any]] = []
    taken: Counter[str] = Counter()
    scanned = 0
    for batch in iter_batches(artifact.file(QUARANTINE_FILE), batch_rows=1024):
        for row in batch.to_pylist():
            if taken[row["reason"]] < per_reason:
                taken[row["reason"]] += 1
                samples.append(row)
        scanned += batch.num_rows
        if scanned >= scan_rows:
            break
    return samples
